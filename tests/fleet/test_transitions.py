"""The state machines: every edge allowed, every other refused, and one winner per race."""

from __future__ import annotations

import threading
from typing import get_args

import pytest
from django.db import connection

from audit.models import Event
from fleet.models import Node, NodeState, Replica, ReplicaState, Shard, ShardState
from fleet.transitions import (
    NODE_TRANSITIONS,
    REPLICA_TRANSITIONS,
    SHARD_TRANSITIONS,
    transition,
)
from protocol.shard import SHARD_LIVE, SHARD_READY
from protocol.shard import ShardState as ProtocolShardState
from tests.factories import SETUP, make_node, make_replica, make_shard

MACHINES = {
    "node": (Node, NodeState, NODE_TRANSITIONS),
    "replica": (Replica, ReplicaState, REPLICA_TRANSITIONS),
    "shard": (Shard, ShardState, SHARD_TRANSITIONS),
}

EXPECTED_EDGES = {
    "node": {
        ("connected", "unreachable"), ("connected", "lost"), ("unreachable", "connected"),
        ("unreachable", "lost"), ("lost", "connected"),
    },
    "shard": {
        ("pending", "fetching"), ("pending", "starting"), ("pending", "ready"),
        ("pending", "failed"), ("pending", "stopped"), ("fetching", "starting"),
        ("fetching", "failed"), ("fetching", "stopped"), ("starting", "ready"),
        ("starting", "failed"), ("starting", "stopped"), ("ready", "starting"),
        ("ready", "failed"), ("ready", "stopped"),
    },
    "replica": {
        ("placing", "starting"), ("placing", "unplaceable"), ("placing", "stopping"),
        ("unplaceable", "placing"), ("unplaceable", "stopping"), ("starting", "ready"),
        ("starting", "failed"), ("starting", "stopping"), ("ready", "starting"),
        ("ready", "failed"), ("ready", "stopping"), ("failed", "stopping"),
        ("stopping", "stopped"),
    },
}  # fmt: skip


def _all_pairs():
    for kind, (_model, states, _machine) in MACHINES.items():
        for source in states.values:
            for target in states.values:
                if source != target:
                    allowed = (source, target) in EXPECTED_EDGES[kind]
                    yield pytest.param(
                        kind, source, target, allowed, id=f"{kind}-{source}-{target}"
                    )


def _make(kind: str, state: str):
    if kind == "node":
        return make_node(state=state)
    if kind == "replica":
        return make_replica(state=state)
    return make_shard(state=state)


@pytest.mark.django_db
@pytest.mark.parametrize(("kind", "source", "target", "allowed"), list(_all_pairs()))
def test_every_transition_is_allowed_or_refused(kind, source, target, allowed):
    model = MACHINES[kind][0]
    row = _make(kind, source)
    result = transition(model, row.pk, target, why="test", actor=SETUP)
    row.refresh_from_db()
    if allowed:
        assert result == source
        assert row.state == target
        event = Event.objects.get(subject=str(row.pk), kind=kind)
        assert (event.from_state, event.to_state, event.reason) == (source, target, "test")
    else:
        assert result is None
        assert row.state == source
        assert not Event.objects.filter(subject=str(row.pk), kind=kind).exists()


@pytest.mark.django_db
def test_a_transition_writes_extra_fields_only_when_it_happens():
    shard = make_shard(state=ShardState.STOPPED)
    assert transition(Shard, shard.pk, ShardState.READY, "late", pid=42, actor=SETUP) is None
    shard.refresh_from_db()
    assert shard.pid is None


@pytest.mark.django_db
def test_a_missing_row_is_not_an_error():
    assert transition(Node, "ghost", NodeState.LOST, "gone", actor=SETUP) is None


@pytest.mark.django_db(transaction=True)
def test_two_workers_racing_on_one_row_cannot_both_win():
    replica = make_replica(state=ReplicaState.STARTING)
    barrier = threading.Barrier(2)
    results: list[str | None] = []

    def worker() -> None:
        try:
            barrier.wait()
            results.append(
                transition(Replica, replica.pk, ReplicaState.READY, "health", actor=SETUP)
            )
        finally:
            connection.close()

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results, key=str) == [None, "starting"]
    assert Event.objects.filter(subject=str(replica.pk), to_state="ready").count() == 1


@pytest.mark.django_db(transaction=True)
def test_racing_to_different_targets_serialises_the_second_through_the_machine():
    # connected -> unreachable and connected -> lost race; lost -> unreachable is not an
    # edge, so if lost wins, unreachable must lose rather than overwrite it.
    node = make_node(state=NodeState.CONNECTED)
    barrier = threading.Barrier(2)
    results: dict[str, str | None] = {}

    def worker(target: str) -> None:
        try:
            barrier.wait()
            results[target] = transition(Node, node.pk, target, "liveness", actor=SETUP)
        finally:
            connection.close()

    threads = [threading.Thread(target=worker, args=(t,)) for t in ("unreachable", "lost")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    node.refresh_from_db()
    if results["unreachable"] is None:
        assert node.state == "lost" and results["lost"] == "connected"
    else:
        # unreachable won first; lost then legitimately follows from unreachable.
        assert node.state == "lost" and results["lost"] == "unreachable"


def test_the_shard_state_names_readers_use_are_the_rows_own():
    """Benches and agents compare with protocol's names; the rows hold fleet's."""
    assert set(get_args(ProtocolShardState)) == set(ShardState.values)
    assert set(SHARD_LIVE) == set(ShardState.LIVE)
    assert SHARD_READY == ShardState.READY
