"""Scores: how much better one node that passed every filter is than another.

Each scorer, registered by name in SCORERS, gives a number in [0, 1], recorded
in the decision. They are compared in order, not summed, so each reads as a rule:

1. nvlink  — a tensor-parallel group joined by NVLink; a straddling group runs
             several times slower for as long as the replica lives.
2. spread  — spread only: fewest replicas of the same profile on the node, so that
             losing one node leaves the profile serving. Before weights, since the
             node running a replica always holds its weights.
3. weights — the node already holds the model. A preference and never a filter:
             fetching is a valid answer, and refusing would turn a slow start
             into no start at all.
4. gpus    — pack: fewest free GPUs left after; spread: most.
5. ram     — the same for host RAM.

Ties go to the lowest node id, so the same snapshot always gives the same answer.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import NamedTuple

from placement.nvlink import choose_gpus
from placement.snapshot import NodeSnapshot, PlacementRequest

_GIB = 1 << 30


class Fit(NamedTuple):
    """What a node offers one rank whatever the weights: its GPUs, and how NVLink joins them."""

    gpus: tuple[int, ...]
    nvlink: float


Scorer = Callable[[NodeSnapshot, PlacementRequest, Fit], float]


class Candidate(NamedTuple):
    """A node that passed every filter, the GPUs it would give, and its scores."""

    node: str
    gpus: tuple[int, ...]
    scores: Mapping[str, float]
    order: tuple[float | str, ...]  # sort key: the best candidate sorts first


def nvlink_joined(node: NodeSnapshot, request: PlacementRequest, fitted: Fit) -> float:
    """Score how well NVLink joins the GPUs chosen for the rank (1 when all are linked)."""
    return fitted.nvlink


def fewest_replicas(node: NodeSnapshot, request: PlacementRequest, fitted: Fit) -> float:
    """Score 1 for a node without a replica of the profile, less for each it has (spread)."""
    if not request.spread_key:
        return 0.0
    return 1.0 / (1.0 + node.replicas.get(request.spread_key, 0))


def holds_weights(node: NodeSnapshot, request: PlacementRequest, fitted: Fit) -> float:
    """Score 1 for a node that holds the weights (not merely fetching them), else 0."""
    return 1.0 if request.weights_key and request.weights_key in node.weights else 0.0


def gpus_left(node: NodeSnapshot, request: PlacementRequest, fitted: Fit) -> float:
    """Score the free GPUs the rank leaves behind, as the strategy likes them."""
    return _left(len(node.gpus) - request.gpus_per_rank, request)


def ram_left(node: NodeSnapshot, request: PlacementRequest, fitted: Fit) -> float:
    """Score the host RAM (in GiB) the rank leaves behind, as the strategy likes it."""
    return _left((node.ram_free - request.memory) / _GIB, request)


def _left(left: float, request: PlacementRequest) -> float:
    """Pack likes little left after placing, spread likes much."""
    packed = 1.0 / (1.0 + max(left, 0.0))
    return packed if request.strategy == "pack" else 1.0 - packed


# Compared in this order: a later scorer only breaks the ties of the earlier ones.
SCORERS: tuple[tuple[str, Scorer], ...] = (
    ("nvlink", nvlink_joined),
    ("spread", fewest_replicas),
    ("weights", holds_weights),
    ("gpus", gpus_left),
    ("ram", ram_left),
)


def fit_node(node: NodeSnapshot, request: PlacementRequest) -> Fit | None:
    """Choose the node's GPUs for one rank; None if the GPUs do not fit."""
    fitting = [gpu for gpu in node.gpus if gpu.memory_free >= request.gpu_memory]
    group = choose_gpus(fitting, request.gpus_per_rank)
    if group is None:
        return None
    return Fit(group.indices, group.score)


def score(
    node: NodeSnapshot, request: PlacementRequest, fitted: Fit | None = None
) -> Candidate | None:
    """Score a node that passed the filters, reusing its Fit when the caller has one."""
    fitted = fitted or fit_node(node, request)
    if fitted is None:
        return None
    scores = {name: scorer(node, request, fitted) for name, scorer in SCORERS}
    order: tuple[float | str, ...] = (*(-value for value in scores.values()), node.id)
    return Candidate(node.id, fitted.gpus, scores, order)
