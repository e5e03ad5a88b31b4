"""Two of three nodes powered off: the model serves again in seconds, not after the
mass-silence hold. When no router reaches any replica of a model and their nodes are
silent, a stand-in is placed at once on a node that is heard; it is retired once the
originals answer again, and counts as one of them once their nodes are lost."""

from __future__ import annotations

import json
import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from audit.actors import AGENT_LINK
from audit.models import Event
from catalog.actions.entries import apply_catalog
from fleet.actions.shard_reports import record_shard_status
from fleet.models import Node, NodeState, Replica, Shard
from fleet.reconcile.passes import reconcile
from fleet.transitions import transition
from protocol import messages
from protocol.routing import INFLIGHT_KEY_PREFIX, RoutingSnapshot
from router.balance.balancer import Balancer
from router.balance.inflight import inflight_report
from router.table.routes import RoutingTable
from tests.factories import SETUP
from tests.fleet.cluster import catalog, connect
from tests.fleet.queues import broker

pytestmark = pytest.mark.django_db


class Fleet:
    """Passes with a clock the test moves; agents' and routers' reports written by hand."""

    def __init__(self, capture, node_ids: list[str]) -> None:
        self.capture = capture
        self.nodes = node_ids
        self.now = timezone.now()
        self.routers: list[str] = []

    def run(self, seconds: float = 2):
        self.now += timedelta(seconds=seconds)
        with self.capture(execute=True):
            return reconcile(now=self.now)

    def ready(self) -> None:
        """Every starting replica's engines answer; every stopping one's exit."""
        for state, said in (("starting", "ready"), ("stopping", "stopped")):
            for shard in Shard.objects.filter(replica__state=state).exclude(node=None):
                with self.capture(execute=True):
                    record_shard_status(
                        shard.node_id,
                        messages.ShardStatus(shard_id=shard.id, state=said),
                        actor=AGENT_LINK,
                    )

    def node(self, node_id: str, state: str) -> None:
        transition(Node, node_id, state, "as the test says", actor=SETUP)

    def router_says(self, failing=(), routed=()) -> None:
        key = INFLIGHT_KEY_PREFIX + f"test-{uuid.uuid4().hex[:8]}"
        body = {"at": self.now.timestamp(), "routed": [str(r) for r in routed], "inflight": {},
                "failing": [str(r) for r in failing]}  # fmt: skip
        broker().set(key, json.dumps(body), ex=60)
        self.routers.append(key)


@pytest.fixture
def fleet(node_ids, django_capture_on_commit_callbacks):
    leftover = broker().keys(INFLIGHT_KEY_PREFIX + "*")
    if leftover:
        broker().delete(*leftover)
    # Both replicas on node 1, as P4's both sat on the nodes powered off; node 0 has room.
    connect(node_ids[1])
    apply_catalog(catalog(replicas=2), actor=SETUP)
    made = Fleet(django_capture_on_commit_callbacks, node_ids)
    made.run()
    made.ready()
    connect(node_ids[0])
    yield made
    if made.routers:
        broker().delete(*made.routers)


def originals() -> list[Replica]:
    return list(Replica.objects.filter(stands_in_since__isnull=True, state="ready"))


def stand_ins() -> list[Replica]:
    return list(Replica.objects.filter(stands_in_since__isnull=False))


def test_a_model_no_router_reaches_gets_a_stand_in_on_a_heard_node_at_once(fleet):
    first = originals()
    fleet.node(fleet.nodes[1], NodeState.UNREACHABLE)
    fleet.router_says(failing=[r.id for r in first], routed=[r.id for r in first])

    report = fleet.run()

    [stand_in] = stand_ins()
    assert str(stand_in.id) in report.placed and stand_in.state == "starting"
    assert stand_in.shards.get().node_id == fleet.nodes[0]
    assert Node.objects.get(id=fleet.nodes[1]).state == NodeState.UNREACHABLE  # not lost
    assert Event.objects.filter(subject=str(stand_in.id), reason__startswith="stands in for the 2")
    fleet.run()
    assert len(stand_ins()) == 1  # one stand-in, not one a pass
    assert Replica.objects.filter(state="ready").count() == 2  # nothing of theirs stopped


def test_no_stand_in_while_some_router_may_still_reach_a_replica(fleet):
    # The control plane alone cut off from the node (its own network): the routers'
    # breakers take nothing out, so the replicas are taken to serve.
    fleet.node(fleet.nodes[1], NodeState.UNREACHABLE)
    first = originals()
    fleet.router_says(failing=[first[0].id], routed=[r.id for r in first])

    fleet.run()

    assert stand_ins() == []


def test_no_stand_in_when_only_a_router_cannot_reach_them(fleet):
    first = originals()
    fleet.router_says(failing=[r.id for r in first], routed=[r.id for r in first])

    fleet.run()

    assert stand_ins() == []


def test_the_stand_in_is_retired_once_the_originals_answer_again(fleet):
    first = originals()
    fleet.node(fleet.nodes[1], NodeState.UNREACHABLE)
    fleet.router_says(failing=[r.id for r in first], routed=[r.id for r in first])
    fleet.run()
    fleet.ready()
    [stand_in] = stand_ins()
    assert Replica.objects.get(id=stand_in.id).state == "ready"

    fleet.node(fleet.nodes[1], NodeState.CONNECTED)
    report = fleet.run()
    assert report.draining == [str(stand_in.id)]
    report = fleet.run(seconds=60)  # past its drain_timeout
    assert report.stopping == [str(stand_in.id)]
    assert [r.id for r in originals()] == [r.id for r in first]


def test_the_stand_in_counts_as_a_replacement_once_the_originals_nodes_are_lost(fleet):
    first = originals()
    fleet.node(fleet.nodes[1], NodeState.UNREACHABLE)
    fleet.router_says(failing=[r.id for r in first], routed=[r.id for r in first])
    fleet.run()
    fleet.ready()
    [stand_in] = stand_ins()

    fleet.node(fleet.nodes[1], NodeState.LOST)  # after the mass-silence hold
    report = fleet.run()

    assert Replica.objects.get(id=stand_in.id).stands_in_since is None
    assert len(report.created) == 1  # the second replacement; the stand-in is the first
    assert stand_ins() == []


def test_a_router_reports_the_replicas_its_breakers_took_out():
    table = RoutingTable.from_snapshot(RoutingSnapshot.model_validate(
        {"models": [{"name": "gemma", "endpoints": [
            {"replica": "r1", "url": "http://10.0.0.1:20000", "secret": ""},
            {"replica": "r2", "url": "http://10.0.0.1:20001", "secret": ""},
        ]}]}
    ))  # fmt: skip
    balancer = Balancer(failure_threshold=3)
    for _ in range(3):
        balancer.started("r1")
        balancer.finished("r1", ok=False)
    balancer.started("r2")
    balancer.finished("r2", ok=False)  # one failure: not taken out

    assert inflight_report(table, balancer, now=1.0)["failing"] == ["r1"]
