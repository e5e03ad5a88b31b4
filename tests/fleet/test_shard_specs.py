"""What a node is told to run for one rank: its side of the fabric placement chose, exactly."""

from __future__ import annotations

import pytest

from fleet.planning.shard_specs import MeetingPoints, meeting_points, shard_spec
from placement import FabricSnapshot
from protocol.shard import FabricAssignment
from tests.factories import make_node, make_replica, make_shard

pytestmark = pytest.mark.django_db

SIDES = [
    (
        "active-adapters-exactly",
        FabricSnapshot("ib-a", 400.0, ("mlx5_0", "mlx5_1"), "ib0", ("mlx5_2",)),
        FabricAssignment(name="ib-a", adapters=["mlx5_0", "mlx5_1"], socket_ifname="ib0"),
    ),
    (
        "no-socket-interface-known",
        FabricSnapshot("ib-a", 400.0, ("mlx5_1",)),
        FabricAssignment(name="ib-a", adapters=["mlx5_1"]),
    ),
]


@pytest.mark.parametrize(
    ("side", "assignment"), [case[1:] for case in SIDES], ids=[case[0] for case in SIDES]
)
def test_a_rank_across_nodes_is_told_its_own_side_of_the_fabric(side, assignment):
    node = make_node("node01", address="10.0.0.1")
    replica = make_replica()
    shard = make_shard(replica, node=node, port=20000)

    spec = shard_spec(replica, shard, node, 2, MeetingPoints("10.0.0.1:20001"), side, epoch=3)

    assert spec.fabric == assignment
    assert (spec.world_size, spec.rendezvous, spec.epoch) == (2, "10.0.0.1:20001", 3)


def test_a_single_node_rank_is_told_no_fabric():
    node = make_node("node01")
    replica = make_replica()
    shard = make_shard(replica, node=node, port=20000)

    assert shard_spec(replica, shard, node, 1, MeetingPoints(), None, epoch=0).fabric is None


def test_meeting_points_name_rank_0s_rendezvous_and_every_worker_in_rank_order():
    nodes = {
        "node01": make_node("node01", address="10.0.0.1"),
        "node02": make_node("node02", address="10.0.0.2"),
        "node03": make_node("node03", address="10.0.0.3"),
    }
    replica = make_replica()
    placed = [("node01", 20000), ("node03", 20004), ("node02", 20002)]
    shards = [
        make_shard(replica, node=nodes[name], port=port, rank=rank)
        for rank, (name, port) in enumerate(placed)
    ]

    meeting = meeting_points(shards, nodes)

    assert meeting.rendezvous == "10.0.0.1:20001"
    assert meeting.workers == ("10.0.0.3:20004", "10.0.0.2:20002")
    spec = shard_spec(replica, shards[0], nodes["node01"], 3, meeting, None, epoch=1)
    assert spec.workers == ["10.0.0.3:20004", "10.0.0.2:20002"]
    assert meeting_points(shards[:1], nodes) == MeetingPoints()
