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


def test_workers_listen_on_their_fabrics_own_address_and_rank_0_is_told_it():
    nodes = {
        "node01": make_node("node01", address="10.0.0.1"),
        "node02": make_node("node02", address="10.0.0.2"),
        "node03": make_node("node03", address="10.0.0.3"),
    }
    replica = make_replica()
    shards = [
        make_shard(replica, node=nodes[name], port=20000, rank=rank)
        for rank, name in enumerate(nodes)
    ]
    # node02's fabric has an IPoIB address; node03's has none: it listens on its own.
    sides = [
        FabricSnapshot("ib-a", 400.0, ("mlx5_0",), "ib0", socket_address="192.168.7.1"),
        FabricSnapshot("ib-a", 400.0, ("mlx5_0",), "ib0", socket_address="192.168.7.2"),
        FabricSnapshot("ib-a", 400.0, ("mlx5_0",)),
    ]

    meeting = meeting_points(shards, nodes, sides)
    specs = [
        shard_spec(replica, shard, nodes[shard.node_id], 3, meeting, side, 1, ["198.18.0.20"])
        for shard, side in zip(shards, sides, strict=True)
    ]

    assert meeting.workers == ("192.168.7.2:20000", "10.0.0.3:20000")
    assert [spec.host for spec in specs] == ["10.0.0.1", "192.168.7.2", "10.0.0.3"]
    assert specs[1].fabric is not None and specs[1].fabric.address == "192.168.7.2"
    # Each rank knows every rank's addresses (its walls admit them), and the callers.
    assert specs[1].ranks == [["10.0.0.1", "192.168.7.1"], ["10.0.0.2", "192.168.7.2"],
                              ["10.0.0.3"]]  # fmt: skip
    assert specs[0].callers == ["198.18.0.20"]
