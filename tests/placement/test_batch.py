"""place_batch: later requests see what earlier ones took, and the caller's snapshots do not."""

from __future__ import annotations

import copy
import random
from dataclasses import replace

import pytest

from placement import NodeSnapshot, PlacementRequest, place, place_batch, refusals_for
from placement.scores import score
from tests.placement.builders import GIB, fabric, gpus, node, paired, request

TP8 = {"gpus_per_rank": 8, "gpu_memory": 70 * GIB}


def test_second_request_goes_elsewhere_and_snapshots_are_untouched() -> None:
    nodes = [node("node01"), node("node02")]
    before = copy.deepcopy(nodes)

    first, second = place_batch([request(**TP8), request(replica_key="chat-1", **TP8)], nodes)

    assert (first.ranks[0].node, second.ranks[0].node) == ("node01", "node02")
    assert nodes == before
    assert second.nodes_available == 1


def test_gpus_are_taken_one_group_at_a_time() -> None:
    nodes = [node("node01", gpus=gpus(4, links=paired([0, 1, 2, 3])))]
    tp2 = request(gpus_per_rank=2)

    decisions = place_batch([tp2, tp2, tp2], nodes)

    assert [d.ranks[0].gpus for d in decisions[:2]] == [(0, 1), (2, 3)]
    assert decisions[2].reasons == ["node01: needs 2 GPUs with 40 GiB free, has 0"]
    assert decisions[2].summary == "0/1 nodes available: 1 lacks free GPUs"


def test_ram_taken_by_one_replica_is_not_offered_to_the_next() -> None:
    nodes = [node("node01", ram_free=100 * GIB), node("node02", ram_free=100 * GIB)]

    decisions = place_batch([request(), request()], nodes)

    assert [d.ranks[0].node for d in decisions] == ["node01", "node02"]


def test_weights_are_fetched_once_per_node_and_their_disk_is_taken() -> None:
    nodes = [node("node01", disk_free=200 * GIB)]
    other_model = request(weights_key="hf://org/code")

    decisions = place_batch([request(), request(), other_model], nodes)

    assert [d.placed for d in decisions] == [True, True, False]
    assert decisions[2].reasons == ["node01: needs 140 GiB disk free for weights, has 60 GiB"]


def test_a_refusal_is_worked_out_again_once_the_fleet_changes() -> None:
    nodes = [node("node01", gpus=gpus(4)), node("node02", gpus=gpus(1))]
    tp2 = request(gpus_per_rank=2)
    tp4 = request(gpus_per_rank=4, memory=0)

    refused, _, again = place_batch(
        [request(gpus_per_rank=8), tp2, request(gpus_per_rank=8)], nodes
    )
    _, after = place_batch([tp4, tp4], nodes)

    assert refused.reasons == [
        "node01: needs 8 GPUs with 40 GiB free, has 4",
        "node02: needs 8 GPUs with 40 GiB free, has 1",
    ]
    assert again.reasons == [
        "node01: needs 8 GPUs with 40 GiB free, has 2",
        "node02: needs 8 GPUs with 40 GiB free, has 1",
    ]
    assert after.summary == "0/2 nodes available: 2 lack free GPUs"


def test_multi_node_replicas_take_their_nodes() -> None:
    ib_a = (fabric("ib-a"),)
    nodes = [node(f"node0{n}", fabrics=ib_a) for n in range(1, 5)]
    tp8x2 = request(ranks=2, **TP8)

    first, second, third = place_batch([tp8x2, tp8x2, tp8x2], nodes)

    assert [r.node for r in first.ranks] == ["node01", "node02"]
    assert [r.node for r in second.ranks] == ["node03", "node04"]
    assert third.problem == "needs 2 nodes on one fabric; ib-a has 0 eligible nodes"


def test_place_is_a_batch_of_one() -> None:
    nodes = [node("node01", gpus=gpus(2)), node("node02")]

    assert place(request(), nodes) == place_batch([request()], nodes)[0]


def test_input_order_does_not_change_the_answer() -> None:
    nodes = [node(f"node{n:02d}", gpus=gpus(n % 3 + 1)) for n in range(12)]
    requests = [request(replica_key=f"chat-{n}", gpus_per_rank=n % 2 + 1) for n in range(10)]
    shuffled = nodes[:]
    random.Random(3).shuffle(shuffled)

    assert place_batch(requests, nodes) == place_batch(requests, shuffled)


def test_a_node_listed_twice_is_an_error() -> None:
    with pytest.raises(ValueError, match="node node01 appears twice"):
        place(request(), [node("node01"), node("node01")])


def test_a_replica_with_no_ranks_is_an_error() -> None:
    with pytest.raises(ValueError, match="replica chat-0: needs ranks >= 1"):
        place(request(ranks=0), [node()])


def _random_fleet(rng: random.Random) -> list[NodeSnapshot]:
    fleet = []
    for n in range(25):
        count = rng.choice((0, 1, 2, 4, 8))
        links = paired(list(range(count))) if rng.random() < 0.6 else None
        fleet.append(
            node(
                f"node{n:02d}",
                state=rng.choice(("connected",) * 8 + ("draining", "lost")),
                pool=rng.choice(("", "a", "b")),
                engines=rng.choice((None, {}, {"vllm": ("0.7.0",)}, {"vllm": ("0.7.0",)})),
                gpus=gpus(count, free=rng.choice((20, 50, 80)) * GIB, links=links),
                ram_free=rng.choice((32, 128, 512)) * GIB,
                disk_free=rng.choice((100, 300, 1000)) * GIB,
                weights=frozenset(rng.sample(["m1", "m2", "m3"], rng.randrange(3))),
            )
        )
    return fleet


def _random_requests(rng: random.Random) -> list[PlacementRequest]:
    return [
        request(
            replica_key=f"r{n}",
            gpus_per_rank=rng.choice((0, 1, 1, 2, 4)),
            gpu_memory=rng.choice((0, 40 * GIB)),
            memory=rng.choice((16, 64)) * GIB,
            disk=rng.choice((50, 140)) * GIB,
            weights_key=rng.choice(("m1", "m2", "m3", "")),
            pool=rng.choice(("", "", "a")),
            strategy=rng.choice(("pack", "spread")),
        )
        for n in range(80)
    ]


def _brute_force(
    requests: list[PlacementRequest], nodes: list[NodeSnapshot]
) -> list[tuple[str, tuple[int, ...]] | None]:
    """Evaluate every node for every request, taking resources by hand after each."""
    fleet = {n.id: n for n in nodes}
    answers: list[tuple[str, tuple[int, ...]] | None] = []
    for req in requests:
        found = [score(n, req) for n in fleet.values() if not refusals_for(n, req)]
        candidates = [c for c in found if c is not None]
        if not candidates:
            answers.append(None)
            continue
        best = min(candidates, key=lambda c: c.order)
        answers.append((best.node, best.gpus))
        chosen = fleet[best.node]
        has = req.weights_key and (
            req.weights_key in chosen.weights or req.weights_key in chosen.weights_fetching
        )
        replicas = dict(chosen.replicas)
        if req.spread_key:
            replicas[req.spread_key] = replicas.get(req.spread_key, 0) + 1
        fleet[best.node] = replace(
            chosen,
            gpus=tuple(g for g in chosen.gpus if g.index not in best.gpus),
            ram_free=chosen.ram_free - req.memory,
            disk_free=chosen.disk_free - (0 if has else req.disk),
            weights_fetching=chosen.weights_fetching
            | ({req.weights_key} if req.weights_key else set()),
            replicas=replicas,
        )
    return answers


@pytest.mark.parametrize("seed", range(6), ids=[f"seed-{seed}" for seed in range(6)])
def test_batch_agrees_with_evaluating_every_node_every_time(seed: int) -> None:
    rng = random.Random(seed)
    nodes, requests = _random_fleet(rng), _random_requests(rng)

    decisions = place_batch(requests, nodes)

    answers = [(d.ranks[0].node, d.ranks[0].gpus) if d.placed else None for d in decisions]
    assert answers == _brute_force(requests, nodes)
    assert any(answers) and not all(answers)


def test_a_refusal_in_brief_shows_a_few_nodes_of_each_shortfall_and_counts_the_rest() -> None:
    busy = [node(f"gpu{i:03d}", gpus=gpus(8, free=0)) for i in range(200)]
    without_vllm = [node(f"old{i:02d}", engines={}, gpus=gpus(8, free=0)) for i in range(5)]

    decision = place(request(), busy + without_vllm)

    assert len(decision.reasons) == 210  # every node's every sentence: the plan page's
    assert decision.summary == (
        "0/205 nodes available: 205 lack free GPU memory, 5 lack engine vllm"
    )
    brief = decision.reasons_in_brief
    # The first three by id under each shortfall, each with all its sentences.
    assert [line.split(":")[0] for line in brief[:-1]] == [
        "gpu000", "gpu001", "gpu002", "old00", "old00", "old01", "old01", "old02", "old02",
    ]  # fmt: skip
    assert brief[-1] == "and 199 more nodes refused it, for the reasons counted above"


def test_a_refusal_on_a_few_nodes_is_given_in_full() -> None:
    nodes = [node(f"gpu{i:02d}", gpus=gpus(8, free=0)) for i in range(10)]

    decision = place(request(), nodes)

    assert decision.reasons_in_brief == decision.reasons
    assert len(decision.reasons) == 10


def test_a_refusal_not_asked_for_is_not_worked_out_but_placing_still_is() -> None:
    nodes = [node("node01", gpus=gpus(1)), node("node02", gpus=gpus(1))]
    tp2 = request(gpus_per_rank=2)
    one = request(replica_key="chat-1")

    refused, placed = place_batch([tp2, one], nodes, unexplained={"chat-0", "chat-1"})

    assert not refused.placed and not refused.explained
    assert refused.refusals == {} and refused.reasons == []
    assert refused.summary == "0/2 nodes available (why: as last worked out)"
    assert placed.placed  # a replica not explained is still placed when it can be
    assert place_batch([tp2], nodes)[0].explained
