"""Replicas spanning nodes: one fabric for every rank, and NCCL told exactly which adapters."""

from __future__ import annotations

import pytest

from placement import place, place_batch
from tests.placement.builders import GIB, fabric, gpus, node, request

CHAT = frozenset({"hf://org/chat"})
TP8X2 = {"gpus_per_rank": 8, "gpu_memory": 70 * GIB, "ranks": 2}


def test_ranks_go_to_different_nodes_on_one_fabric() -> None:
    ib_a = fabric("ib-a", ("mlx5_0", "mlx5_1"))
    nodes = [node("node01", fabrics=(ib_a,)), node("node02", fabrics=(ib_a,))]

    decision = place(request(**TP8X2), nodes)

    assert decision.placed
    assert decision.fabric == "ib-a"
    assert [(rank.rank, rank.node, rank.gpus) for rank in decision.ranks] == [
        (0, "node01", tuple(range(8))),
        (1, "node02", tuple(range(8))),
    ]
    assert [rank.fabric for rank in decision.ranks] == [ib_a, ib_a]
    assert decision.summary == (
        "2/2 nodes available; placed 2 ranks on fabric ib-a: node01 (GPUs 0-7), node02 (GPUs 0-7)"
    )


def test_each_rank_carries_its_own_nodes_side_of_the_fabric() -> None:
    node02_side = fabric("ib-a", ("mlx5_2",), inactive=("mlx5_3",), ifname="")
    nodes = [
        node("node01", fabrics=(fabric("ib-a", ("mlx5_0", "mlx5_1")),)),
        node("node02", fabrics=(node02_side, fabric("ib-b", ("mlx5_4",)))),
    ]

    decision = place(request(**TP8X2), nodes)

    assert decision.ranks[1].fabric == node02_side
    assert decision.ranks[1].fabric.adapters == ("mlx5_2",)


def test_rank_zero_is_the_best_node() -> None:
    ib_a = fabric("ib-a")
    nodes = [node("node01", fabrics=(ib_a,)), node("node02", fabrics=(ib_a,), weights=CHAT)]

    decision = place(request(**TP8X2), nodes)

    assert [rank.node for rank in decision.ranks] == ["node02", "node01"]


def test_the_fabric_with_enough_nodes_wins_over_the_best_single_node() -> None:
    nodes = [
        node("node01", fabrics=(fabric("ib-a"),), weights=CHAT),
        node("node02", fabrics=(fabric("ib-b"),)),
        node("node03", fabrics=(fabric("ib-b"),)),
    ]

    decision = place(request(**TP8X2), nodes)

    assert decision.fabric == "ib-b"
    assert [rank.node for rank in decision.ranks] == ["node02", "node03"]
    assert "node01" in decision.scores  # compared, and lost for want of a partner


def test_a_node_completing_two_fabrics_at_once_takes_the_faster() -> None:
    both = (fabric("ib-a", rate=200.0), fabric("roce", ("mlx5_4",), rate=400.0))
    nodes = [node("node01", fabrics=both), node("node02", fabrics=both)]

    assert place(request(**TP8X2), nodes).fabric == "roce"


REFUSED_ACROSS_FABRICS = [
    (
        "one-each",
        [("node01", "ib-a", 8), ("node02", "ib-b", 8)],
        "2/2 nodes available; needs 2 nodes on one fabric; ib-a has 1 eligible node, ib-b has 1",
    ),
    (
        "one-and-none",
        [("node01", "ib-a", 8), ("node02", "ib-b", 4)],
        "1/2 nodes available: 1 lacks free GPUs; "
        "needs 2 nodes on one fabric; ib-a has 1 eligible node, ib-b has 0",
    ),
    (
        "none-anywhere",
        [("node01", "ib-a", 4), ("node02", "ib-b", 4)],
        "0/2 nodes available: 2 lack free GPUs; "
        "needs 2 nodes on one fabric; ib-a has 0 eligible nodes, ib-b has 0",
    ),
]


@pytest.mark.parametrize(
    ("layout", "summary"),
    [case[1:] for case in REFUSED_ACROSS_FABRICS],
    ids=[case[0] for case in REFUSED_ACROSS_FABRICS],
)
def test_refused_when_no_fabric_has_enough_nodes(
    layout: list[tuple[str, str, int]], summary: str
) -> None:
    nodes = [node(i, fabrics=(fabric(name),), gpus=gpus(count)) for i, name, count in layout]

    decision = place(request(**TP8X2), nodes)

    assert not decision.placed
    assert decision.summary == summary
    assert decision.reasons[0] == decision.problem == summary[summary.index("needs") :]


def test_a_fabric_with_an_inactive_adapter_only_does_not_count() -> None:
    nodes = [
        node("node01", fabrics=(fabric("ib-a"),)),
        node("node02", fabrics=(fabric("ib-a", (), inactive=("mlx5_0",)),)),
    ]

    decision = place(request(**TP8X2), nodes)

    assert decision.problem == "needs 2 nodes on one fabric; ib-a has 1 eligible node"
    assert decision.refusals == {
        "node02": ("no active fabric for a 2-node replica (ib-a: mlx5_0 not active)",)
    }


def test_a_single_node_replica_needs_no_fabric() -> None:
    decision = place(request(gpus_per_rank=8), [node("node01")])

    assert decision.placed
    assert decision.fabric == ""
    assert decision.ranks[0].fabric is None


# llama.cpp over RPC: only rank 0 opens the GGUF; rpc-server workers are sent their tensors.
RPC = {"engine": "llama.cpp", "gpus_per_rank": 0, "gpu_memory": 0, "ranks": 3,
       "disk": 140 * GIB, "workers_read_weights": False}  # fmt: skip
LLAMA = {"llama.cpp": ("b6000",)}


def test_workers_that_read_no_weights_need_no_disk_for_them() -> None:
    ib_a = fabric("ib-a")
    nodes = [node(f"node0{n}", fabrics=(ib_a,), engines=LLAMA, disk_free=10 * GIB)
             for n in (1, 2)]  # fmt: skip
    nodes.append(node("node03", fabrics=(ib_a,), engines=LLAMA, disk_free=500 * GIB))

    decision = place(request(**RPC), nodes)

    assert decision.placed, decision.reasons
    assert [rank.node for rank in decision.ranks] == ["node03", "node01", "node02"]


def test_workers_that_read_weights_each_need_disk_for_them() -> None:
    ib_a = fabric("ib-a")
    nodes = [node(f"node0{n}", fabrics=(ib_a,), engines=LLAMA, disk_free=10 * GIB)
             for n in (1, 2)]  # fmt: skip
    nodes.append(node("node03", fabrics=(ib_a,), engines=LLAMA, disk_free=500 * GIB))

    decision = place(request(**{**RPC, "workers_read_weights": True}), nodes)

    assert not decision.placed
    assert "node01: needs 140 GiB disk free for weights, has 10 GiB" in decision.reasons


def test_only_rank_0s_node_has_its_disk_taken() -> None:
    ib_a = fabric("ib-a")
    nodes = [node(f"node0{n}", fabrics=(ib_a,), engines=LLAMA, disk_free=150 * GIB)
             for n in (1, 2, 3)]  # fmt: skip
    two = {**RPC, "ranks": 2}

    first, second, third = place_batch(
        [request(**two, replica_key=key, weights_key=key) for key in ("a", "b", "c")], nodes
    )

    # Each replica's rank 0 takes 140 GiB of one node; its worker takes none.
    assert [d.ranks[0].node for d in (first, second, third)] == ["node01", "node02", "node03"]
    assert third.placed


def test_no_node_with_room_for_rank_0_is_said_so() -> None:
    ib_a = fabric("ib-a")
    nodes = [node(f"node0{n}", fabrics=(ib_a,), engines=LLAMA, disk_free=10 * GIB)
             for n in (1, 2, 3)]  # fmt: skip

    decision = place(request(**RPC), nodes)

    assert not decision.placed
    assert decision.problem == (
        "needs 3 nodes on one fabric, one of them with 140 GiB disk free for rank 0's weights "
        "(the other ranks read none); no node on a fabric with enough eligible nodes has it"
    )
    assert "node01: needs 140 GiB disk free for rank 0's weights, has 10 GiB" in decision.reasons
