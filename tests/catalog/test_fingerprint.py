"""The fingerprint changes exactly when something that changes the running engine changes."""

from __future__ import annotations

import pytest

from tests.factories import make_profile

pytestmark = pytest.mark.django_db

MATTERS = [
    ("profile", "engine", "vllm"),
    ("profile", "engine_version", "b7000"),
    ("profile", "gpus_per_rank", 2),
    ("profile", "tensor_parallel", 2),
    ("profile", "nodes", 2),
    ("profile", "context", 8192),
    ("profile", "launch_mode", "ray"),
    ("profile", "args", ["--threads", "4"]),
    ("profile", "env", {"OMP_NUM_THREADS": "2"}),
    ("model", "source", "/models/other.gguf"),
    ("model", "sha256", "a" * 64),
    ("model", "name", "renamed"),
]
DOES_NOT_MATTER = [
    ("profile", "replicas", 5),
    ("profile", "memory", 2 * 1024**3),
    ("profile", "gpu_memory", 40 * 1024**3),
    ("profile", "disk", 10**10),
    ("profile", "pool", "cpu"),
    ("profile", "strategy", "spread"),
    ("profile", "startup_timeout", 1200),
    ("profile", "rollout_surge", 2),
    ("profile", "rollout_unavailable", 1),
    ("profile", "drain_timeout", 120),
    ("profile", "routing", "prefix"),
    ("model", "aliases", ["g"]),
    ("model", "description", "a small model"),
]


def _change(profile, where, field, value):
    target = profile if where == "profile" else profile.model
    setattr(target, field, value)
    target.save()
    profile.refresh_from_db()
    return profile.fingerprint()


@pytest.mark.parametrize(("where", "field", "value"), MATTERS, ids=[m[1] for m in MATTERS])
def test_fingerprint_changes_when_what_runs_changes(where, field, value):
    profile = make_profile(args=["--threads", "2"])
    before = profile.fingerprint()
    assert _change(profile, where, field, value) != before


@pytest.mark.parametrize(
    ("where", "field", "value"), DOES_NOT_MATTER, ids=[m[1] for m in DOES_NOT_MATTER]
)
def test_fingerprint_ignores_what_does_not_change_the_engine(where, field, value):
    profile = make_profile(args=["--threads", "2"])
    before = profile.fingerprint()
    assert _change(profile, where, field, value) == before


def test_env_order_does_not_change_the_fingerprint():
    first = make_profile(env={"A": "1", "B": "2"})
    second = make_profile(model=first.model, name="other", env={"B": "2", "A": "1"})
    assert first.fingerprint() == second.fingerprint()
