"""What llmgw does by itself goes through verbs too (issue 37): a node falling silent or
heard again, a replica failed or stopped by the reconciler, what a pass says of a replica
or a rollout, a sign-in lockout, and the bookkeeping verbs that used to ignore their
actor. Each records its Event naming whoever it was told acted: one of llmgw's parts
(an Event that names no one) or an operator."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from audit.actors import AGENT_LINK, LIVENESS, RECONCILER, SIGN_IN_THROTTLE
from audit.models import Event, EventKind
from catalog.actions.profiles import mark_low_demand_since
from catalog.models import Profile
from fleet.actions.liveness import mark_node_lost, mark_node_unreachable, revive_node
from fleet.actions.nodes import mark_engines_told
from fleet.actions.replicas import fail_replica, finish_stop, note_replica_kept, note_rollout
from fleet.actions.reports import update_weights
from fleet.actions.shard_reports import record_shard_progress
from fleet.actions.sign_ins import record_lockout
from fleet.link.liveness import check_liveness
from fleet.models import Node, NodeState, Replica, ReplicaState, ShardState
from protocol import messages
from protocol.engines import WantedEngine
from tests.factories import make_node, make_profile, make_replica, make_shard, make_user

pytestmark = pytest.mark.django_db

NOW = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


def said(subject: str) -> list[tuple[str, str, str, str]]:
    """(from, to, reason, who) of each Event about ``subject``, oldest first."""
    events = Event.objects.filter(subject=subject).select_related("actor").order_by("id")
    return [(e.from_state, e.to_state, e.reason, e.actor.username if e.actor else e.actor_name)
            for e in events]  # fmt: skip


def silent_node(node_id: str, seconds: float, state: str = NodeState.CONNECTED) -> Node:
    heard = NOW - timedelta(seconds=seconds)
    return make_node(node_id, state=state, registered_at=heard, last_heartbeat=heard)


def test_the_liveness_check_marks_silent_nodes_through_its_verbs_naming_no_one():
    silent_node("quiet", 16)
    silent_node("gone", 61)
    for heard in ("heard1", "heard2", "heard3"):  # so the silence is not our own network's
        silent_node(heard, 2)

    report = check_liveness(NOW)

    assert (report.unreachable, report.lost) == (["quiet"], ["gone"])
    assert said("quiet") == [("connected", "unreachable", "no heartbeat for 16s", "")]
    assert said("gone") == [("connected", "lost", "no heartbeat for 61s", "")]


@pytest.mark.parametrize(
    ("verb", "before", "after", "reason"),
    [
        (lambda n, a: mark_node_unreachable(n, "no heartbeat for 20s", actor=a),
         NodeState.CONNECTED, NodeState.UNREACHABLE, "no heartbeat for 20s"),
        (lambda n, a: mark_node_lost(n, "no heartbeat for 90s", actor=a),
         NodeState.UNREACHABLE, NodeState.LOST, "no heartbeat for 90s"),
        (lambda n, a: revive_node(n, actor=a),
         NodeState.LOST, NodeState.CONNECTED, "heartbeat received again"),
    ],
    ids=["unreachable", "lost", "revived"],
)  # fmt: skip
def test_each_liveness_verb_records_whoever_it_is_told_acted(verb, before, after, reason):
    make_node("node01", state=before)
    olga = make_user("olga", operator=True)

    assert verb("node01", olga) is True
    assert verb("node01", olga) is False  # moved on already: no second Event

    assert Node.objects.get(id="node01").state == after
    assert said("node01") == [(before, after, reason, "olga")]


@pytest.mark.parametrize("actor", [LIVENESS, AGENT_LINK], ids=str)
def test_a_system_actor_is_recorded_as_llmgw_itself(actor):
    make_node("node01", state=NodeState.UNREACHABLE)

    assert revive_node("node01", actor=actor)

    [event] = Event.objects.filter(subject="node01")
    assert (event.actor, event.actor_name, event.description) == (
        None, "", "heartbeat received again"
    )  # fmt: skip


def test_a_replica_that_outlived_its_start_is_failed_by_a_verb():
    replica = make_replica(state=ReplicaState.STARTING)
    olga = make_user("olga", operator=True)
    reason = "not ready within the profile's startup timeout of 600s"

    assert fail_replica(replica.id, reason, actor=olga) is True
    assert fail_replica(replica.id, reason, actor=olga) is False

    replica.refresh_from_db()
    assert (replica.state, replica.reasons) == (ReplicaState.FAILED, [reason])
    assert said(str(replica.id)) == [("starting", "failed", reason, "olga")]


def test_a_stopping_replica_is_finished_by_a_verb_and_only_once():
    replica = make_replica(state=ReplicaState.STOPPING)

    assert finish_stop(replica.id, actor=RECONCILER) is True
    assert finish_stop(replica.id, actor=RECONCILER) is False

    assert Replica.objects.get(id=replica.id).state == ReplicaState.STOPPED
    assert said(str(replica.id)) == [("stopping", "stopped", "every shard has stopped", "")]


def test_what_a_pass_says_of_a_replica_or_a_rollout_is_said_once():
    replica = make_replica(state=ReplicaState.READY)
    profile = replica.profile
    kept = "node node01 is lost; serving until its replacement is ready"
    olga = make_user("olga", operator=True)

    assert note_replica_kept(replica.id, kept, actor=olga) is True
    assert note_replica_kept(replica.id, kept, actor=olga) is False
    assert note_rollout(profile, "waiting for 1 new replica", actor=RECONCILER) is True
    assert note_rollout(profile, "waiting for 1 new replica", actor=RECONCILER) is False

    assert said(str(replica.id)) == [("", "", kept, "olga")]
    assert said(str(profile)) == [("", "", "waiting for 1 new replica", "")]


def test_a_sign_in_lockout_is_recorded_by_a_verb():
    record_lockout("olga", "10.0.0.9", 5, "15 minutes", actor=SIGN_IN_THROTTLE)

    [event] = Event.objects.filter(kind=EventKind.SIGN_IN)
    assert (event.subject, event.to_state, event.reason, event.actor_name) == (
        "olga", "locked", "locked out from 10.0.0.9 for 15 minutes after 5 failed sign-ins", ""
    )  # fmt: skip


# --- The verbs that used to be handed an actor and ignore it ----------------------------

LLAMA = WantedEngine(name="llama.cpp", version="b6000")
VLLM = WantedEngine(name="vllm", version="0.9.1")


def test_nodes_told_a_new_engine_list_record_it_and_a_list_told_again_records_nothing():
    for node_id in ("node01", "node02"):
        make_node(node_id, state=NodeState.CONNECTED)
    olga = make_user("olga", operator=True)

    mark_engines_told(["node01", "node02"], [LLAMA], "digest-1", NOW, actor=olga)
    mark_engines_told(["node01"], [LLAMA], "digest-1", NOW + timedelta(minutes=10), actor=olga)
    mark_engines_told(["node02"], [LLAMA, VLLM], "digest-2", NOW, actor=RECONCILER)

    assert said("node01") == [("", "", "told to have engines: llama.cpp b6000", "olga")]
    assert said("node02") == [
        ("", "", "told to have engines: llama.cpp b6000", "olga"),
        ("", "", "told to have engines: llama.cpp b6000, vllm 0.9.1", ""),
    ]
    assert Node.objects.get(id="node01").engines_told_at == NOW + timedelta(minutes=10)


def weights(*sources: str) -> messages.Weights:
    return messages.Weights(
        weights=[messages.WeightFile(source=s, path=f"/w/{s.rsplit('/', 1)[-1]}") for s in sources]
    )


def test_a_new_weights_list_records_what_the_node_gained_and_no_longer_holds():
    make_node("node01", state=NodeState.CONNECTED)
    a, b = "https://models.example/a.gguf", "https://models.example/b.gguf"

    update_weights("node01", weights(a), actor=AGENT_LINK)
    update_weights("node01", weights(a), actor=AGENT_LINK)  # the same list: nothing new
    update_weights("node01", weights(b), actor=make_user("olga"))

    assert Node.objects.get(id="node01").weights[0]["source"] == b
    assert said("node01") == [
        ("", "", f"holds {a}", ""),
        ("", "", f"holds {b}; no longer holds {a}", "olga"),
    ]


def test_the_first_progress_of_a_download_is_recorded_once():
    node = make_node("node01", state=NodeState.CONNECTED)
    shard = make_shard(make_replica(), node=node, state=ShardState.FETCHING, port=20000)

    for done in (10, 20, 30):
        progress = messages.ShardProgress(shard_id=shard.id, bytes=done, total=15_200_000_000)
        record_shard_progress("node01", progress, actor=AGENT_LINK)

    shard.refresh_from_db()
    assert shard.progress == {"bytes": 30, "total": 15_200_000_000, "rate": None}
    assert said(shard.id) == [("", "", "downloading its weights (14.2 GiB)", "")]


def test_low_demand_is_said_when_it_begins_and_not_at_every_pass():
    profile = make_profile(replicas=3, autoscale={"min": 0, "max": 4, "target_inflight": 2,
                                                  "scale_down_after": 300})  # fmt: skip
    low = "demand is under what its 3 replica(s) need: one fewer if it stays so for 5m"

    mark_low_demand_since(profile.id, NOW, actor=RECONCILER)
    mark_low_demand_since(profile.id, NOW, actor=RECONCILER)  # still low: nothing new
    mark_low_demand_since(profile.id, None, actor=RECONCILER)  # busy again
    mark_low_demand_since(profile.id, NOW + timedelta(seconds=10), actor=RECONCILER)

    assert Profile.objects.get(id=profile.id).autoscale_low_since == NOW + timedelta(seconds=10)
    # Hovering about the target says it once, not at each dip.
    assert said(str(profile)) == [("", "", low, "")]
