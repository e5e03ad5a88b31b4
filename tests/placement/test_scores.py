"""Scores: held weights win ties, NVLink groups, pack and spread, and ties by node id."""

from __future__ import annotations

import pytest

from placement import SCORERS, choose_gpus, place, place_batch
from placement.scores import fit_node, score
from tests.placement.builders import GIB, gpus, node, paired, request

CHAT = frozenset({"hf://org/chat"})


def test_holding_the_weights_wins_a_tie() -> None:
    decision = place(request(), [node("node01"), node("node02", weights=CHAT)])

    assert decision.ranks[0].node == "node02"
    assert decision.scores["node02"]["weights"] == 1.0
    assert decision.scores["node01"]["weights"] == 0.0


def test_holding_the_weights_never_overrides_a_filter() -> None:
    decision = place(request(), [node("node01"), node("node02", weights=CHAT, ram_free=GIB)])

    assert decision.ranks[0].node == "node01"


def test_weights_being_fetched_earn_no_preference() -> None:
    nodes = [node("node01"), node("node02", weights_fetching=CHAT)]

    assert place(request(), nodes).ranks[0].node == "node01"


def test_holding_the_weights_beats_packing() -> None:
    nodes = [node("node01", gpus=gpus(1)), node("node02", weights=CHAT)]

    assert place(request(), nodes).ranks[0].node == "node02"


STRATEGIES = [
    ("pack-fewest-gpus-left", "pack", {}, "node01"),
    ("spread-most-gpus-left", "spread", {}, "node02"),
    ("pack-least-ram-left-on-a-gpu-tie", "pack", {"gpus": gpus(2)}, "node02"),
    ("spread-most-ram-left-on-a-gpu-tie", "spread", {"gpus": gpus(2)}, "node01"),
]


@pytest.mark.parametrize(
    ("strategy", "node02_changes", "chosen"),
    [case[1:] for case in STRATEGIES],
    ids=[case[0] for case in STRATEGIES],
)
def test_pack_and_spread(strategy: str, node02_changes: dict, chosen: str) -> None:
    nodes = [
        node("node01", gpus=gpus(2), ram_free=1024 * GIB),
        node("node02", **({"gpus": gpus(8), "ram_free": 128 * GIB} | node02_changes)),
    ]

    decision = place(request(strategy=strategy), nodes)

    assert decision.ranks[0].node == chosen


def test_cpu_only_replica_packs_onto_the_node_without_free_gpus() -> None:
    nodes = [node("node01"), node("node02", gpus=())]

    decision = place(request(gpus_per_rank=0, gpu_memory=0), nodes)

    assert decision.ranks[0].node == "node02"
    assert decision.ranks[0].gpus == ()


def test_identical_nodes_tie_to_the_lowest_id_and_runners_up_are_recorded() -> None:
    nodes = [node(f"node0{n}") for n in (4, 2, 3, 1)]

    decision = place(request(), nodes)

    assert decision.ranks[0].node == "node01"
    assert sorted(decision.scores) == ["node01", "node02", "node03"]
    assert set(decision.scores["node01"]) == {name for name, _ in SCORERS}
    assert decision.summary == "4/4 nodes available; placed on node01 (GPU 0)"


# GPU 1 is held by a shard: 0 has lost its partner, 2-3 are still a pair.
ORPHAN_AND_PAIR = gpus(1, links=paired([0, 1])) + gpus(2, start=2, links=paired([2, 3]))

GROUPS = [
    ("connected-pair-over-lowest-indices", ORPHAN_AND_PAIR, 2, (2, 3), 1.0),
    ("lowest-indices-without-topology", gpus(4), 2, (0, 1), 0.0),
    ("single-gpu-takes-the-orphan", ORPHAN_AND_PAIR, 1, (0,), 1.0),
    ("single-gpu-keeps-a-pair-whole", gpus(3, links=paired([0, 1, 2, 3])), 1, (2,), 1.0),
    (
        "fully-connected-four-over-a-chain",
        gpus(
            8,
            links={
                0: {1},
                1: {0, 2},
                2: {1, 3},
                3: {2},
                4: {5, 6, 7},
                5: {4, 6, 7},
                6: {4, 5, 7},
                7: {4, 5, 6},
            },
        ),
        4,
        (4, 5, 6, 7),
        1.0,
    ),
    ("whole-board-of-pairs", gpus(8, links=paired(list(range(8)))), 8, tuple(range(8)), 4 / 28),
    ("nothing-to-link-for-no-gpus", gpus(2), 0, (), 1.0),
]


@pytest.mark.parametrize(
    ("free", "count", "indices", "nvlink"),
    [case[1:] for case in GROUPS],
    ids=[case[0] for case in GROUPS],
)
def test_nvlink_grouping(free: tuple, count: int, indices: tuple[int, ...], nvlink: float) -> None:
    group = choose_gpus(free, count)

    assert group is not None
    assert group.indices == indices
    assert group.score == pytest.approx(nvlink)


def test_choose_gpus_refuses_more_than_there_are() -> None:
    assert choose_gpus(gpus(1), 2) is None


def test_large_boards_grow_a_connected_group() -> None:
    # Two fully connected islands of eight: too many combinations to try them all.
    links = {i: set(range(8)) - {i} for i in range(8)}
    links |= {i: set(range(8, 16)) - {i} for i in range(8, 16)}
    free = gpus(16, links=links)

    group = choose_gpus(free[1:], 8)

    assert group is not None
    assert group.indices == tuple(range(8, 16))
    assert group.score == 1.0


def test_node_with_a_linked_pair_beats_one_that_packs_better() -> None:
    nodes = [
        node("node01", gpus=gpus(2)),  # packs tightly, but the two cards share no bridge
        node("node02", gpus=gpus(4, links=paired([0, 1, 2, 3]))),
    ]

    decision = place(request(gpus_per_rank=2), nodes)

    assert (decision.ranks[0].node, decision.ranks[0].gpus) == ("node02", (0, 1))
    assert decision.scores["node01"]["nvlink"] == 0.0
    assert decision.scores["node02"]["nvlink"] == 1.0


def test_gpus_without_the_memory_are_never_chosen() -> None:
    free = gpus(2, free=20 * GIB, links=paired([0, 1])) + gpus(2, start=2)

    candidate = score(node(gpus=free), request(gpus_per_rank=2))

    assert candidate is not None
    assert candidate.gpus == (2, 3)


def test_candidate_order_follows_the_scorers() -> None:
    candidate = score(node(), request())

    assert candidate is not None
    assert candidate.order[:-1] == tuple(-candidate.scores[name] for name, _ in SCORERS)
    assert candidate.order[-1] == "node01"


def test_scorers_are_named_functions_compared_in_their_order() -> None:
    holder, wanted = node(weights=CHAT, gpus=gpus(4, links=paired([0, 1, 2, 3]))), request()
    fitted = fit_node(holder, wanted)
    assert fitted is not None

    candidate = score(holder, wanted, fitted)

    assert candidate is not None
    assert [name for name, _ in SCORERS] == ["nvlink", "spread", "weights", "gpus", "ram"]
    assert candidate.scores == {name: scorer(holder, wanted, fitted) for name, scorer in SCORERS}
    assert candidate.scores["weights"] == 1.0


def test_spread_puts_a_profiles_replicas_on_different_nodes_before_weights() -> None:
    # The node running a replica holds its weights; spread still goes to the other node,
    # so one node's loss leaves the profile serving.
    nodes = [node("node01", weights=CHAT, replicas={"chat/default": 1}), node("node02")]

    assert place(request(strategy="spread"), nodes).ranks[0].node == "node02"
    assert place(request(strategy="pack"), nodes).ranks[0].node == "node01"
    other_profile = request(strategy="spread", profile="long")
    assert place(other_profile, nodes).ranks[0].node == "node01"


def test_a_spread_batch_places_one_replica_per_node_before_doubling_up() -> None:
    nodes = [node("node01", weights=CHAT), node("node02"), node("node03")]
    wanted = [request(replica_key=f"chat-{i}", strategy="spread") for i in range(4)]

    placed = [decision.ranks[0].node for decision in place_batch(wanted, nodes)]

    assert sorted(placed[:3]) == ["node01", "node02", "node03"]
    assert placed[3] == "node01"  # every node has one: the weights decide
