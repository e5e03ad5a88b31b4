"""An engine upgrade does not roll everything by surprise: ``apply --dry-run`` and the
deploy page count the running replicas an engine version change restarts, and
``pin-engines`` pins the version they run in one step, so none restarts."""

from __future__ import annotations

import pytest
import yaml
from django.template.loader import render_to_string

from audit.models import Event
from catalog.actions.entries import apply_catalog
from catalog.actions.profiles import pin_engine_versions
from catalog.models import Engine, Profile, newest_engine_versions
from catalog.schema import ModelEntry
from fleet.models import ReplicaState
from fleet.planning.deploy import plan_model
from fleet.planning.engine_restarts import engine_restarts, running_engine_versions
from protocol.engines import DEFAULT_LLAMA_CPP
from tests.ctl import ctl
from tests.factories import SETUP, make_replica

pytestmark = pytest.mark.django_db

SHA = "ab" * 32


def engine(version: str) -> dict:
    url = f"https://example.org/llama-{version}-bin-ubuntu-x64.tar.gz"
    return {"name": "llama.cpp", "version": version,
            "builds": [{"name": "cpu-x64", "url": url, "sha256": SHA}]}  # fmt: skip


def catalog(*versions: str) -> str:
    profile = {"name": "cpu", "engine": "llama.cpp", "replicas": 2, "memory": "1GiB"}
    data: dict = {"models": [{"name": "gemma", "source": "/models/gemma.gguf",
                              "profiles": [profile]}]}  # fmt: skip
    if versions:
        data["engines"] = [engine(v) for v in versions]
    return yaml.safe_dump(data)


def running(version: str, count: int = 2) -> Profile:
    """gemma/cpu with ``count`` ready replicas running llama.cpp ``version``."""
    profile = Profile.objects.get()
    for _ in range(count):
        make_replica(profile, state=ReplicaState.READY, engine="llama.cpp", engine_version=version)
    return profile


@pytest.fixture
def at_the_shell(monkeypatch):
    monkeypatch.delenv("SUDO_USER", raising=False)
    monkeypatch.setattr("audit.actors.getpass.getuser", lambda: "olga")


def test_a_dry_run_that_adds_an_engine_version_counts_the_replicas_it_restarts(
    tmp_path, at_the_shell
):
    apply_catalog(catalog("b6000"), actor=SETUP)
    running("b6000")
    path = tmp_path / "catalog.yaml"
    path.write_text(catalog("b6000", "b6100"))

    said = ctl("apply", "-f", str(path), "--dry-run")

    assert "an engine version change would restart 2 running replica(s)" in said
    assert "gemma/cpu: 2 replica(s), llama.cpp b6000 -> b6100" in said
    assert not Engine.objects.filter(version="b6100").exists()


@pytest.fixture
def defaults(settings):
    settings.DEFAULT_ENGINES = True  # as llmgw up and production run


def test_a_control_plane_upgrade_with_a_newer_default_is_counted_too(
    tmp_path, at_the_shell, defaults
):
    # The default build moved under the replicas (a control plane upgrade): applying the
    # same file says they restart, and to what.
    apply_catalog(catalog(), actor=SETUP)
    running("xllamacpp-0.0.1")
    path = tmp_path / "catalog.yaml"
    path.write_text(catalog())

    said = ctl("apply", "-f", str(path), "--dry-run")

    assert "would change 0 entries" in said
    assert (
        f"gemma/cpu: 2 replica(s), llama.cpp xllamacpp-0.0.1 -> {DEFAULT_LLAMA_CPP.version}"
    ) in said


def test_pinning_the_running_version_restarts_nothing(tmp_path, at_the_shell):
    apply_catalog(catalog("b6000"), actor=SETUP)
    running("b6000")

    said = ctl("pin-engines")

    assert said.strip() == "pinned gemma/cpu: llama.cpp b6000"
    assert Profile.objects.get().engine_version == "b6000"
    assert Event.objects.filter(subject="gemma/cpu", reason__contains="pinned").exists()
    apply_catalog(catalog("b6000", "b6100"), actor=SETUP)  # the file still leaves it unpinned
    # ... and the apply unpins it: what the file says stands, and the plan said so first.
    assert Profile.objects.get().engine_version == ""


def test_pinning_a_default_build_declares_it_so_an_upgrade_keeps_it(defaults):
    apply_catalog(catalog(), actor=SETUP)
    profile = running(DEFAULT_LLAMA_CPP.version)

    pin_engine_versions(running_engine_versions(), actor=SETUP)

    profile.refresh_from_db()
    assert profile.engine_version == DEFAULT_LLAMA_CPP.version
    declared = Engine.objects.get(name="llama.cpp")
    assert declared.wanted() == DEFAULT_LLAMA_CPP
    assert newest_engine_versions()["llama.cpp"] == DEFAULT_LLAMA_CPP.version
    assert engine_restarts() == []


def test_the_deploy_page_says_how_many_replicas_an_engine_version_restarts(operator):
    apply_catalog(catalog("b6000", "b6100"), actor=SETUP)
    running("b6000")
    entry = ModelEntry.model_validate(yaml.safe_load(catalog("b6000", "b6100"))["models"][0])

    plan = plan_model(entry, creating=False, actor=operator)

    [restart] = plan.engine_restarts
    assert (restart.profile, restart.replicas, restart.running, restart.resolved) == (
        "gemma/cpu", 2, "b6000", "b6100",
    )  # fmt: skip
    page = render_to_string("fleet/includes/plan.html", {"plan": plan})
    assert "An engine version change restarts running replicas" in page
    assert "gemma/cpu: 2 replicas, llama.cpp b6000 → b6100" in page
