"""Placing replicas: filter every node, score the survivors, take what the winner gives.

A batch places requests in order against its own copy of the fleet, so a later
request sees the GPUs, RAM and disk an earlier one took; the caller's snapshots
are frozen and never change.

Speed comes from not re-filtering the fleet for every request. Requests that
filter and score alike (same engine, pool, sizes, weights, strategy) share a
queue: every node that passes, in best-first order. Placing a replica changes
only the nodes it lands on, so only those are evaluated again, for every queue,
and a queue entry from before the change is recognised as stale by its version
and skipped. What a node offers does not depend on which model asks (only its
disk and the weights preference do), so that part is worked out once per kind
of request and shared. A refused request still evaluates every node, because
its answer is the list of reasons, node by node.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Collection, Hashable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from core.humanize import format_bytes
from placement.decision import EXAMPLES_PER_SHORTFALL, Decision, RankPlacement
from placement.fabric import fabric_shortfall, usable_fabrics
from placement.filters import FILTERS, disk_free, holds_or_fetches, refusals_for
from placement.scores import Candidate, Fit, fit_node, score
from placement.snapshot import NodeSnapshot, PlacementRequest

# Candidates compared with the winner that a placed decision records, like the
# top scores Nomad keeps: enough to answer "why there and not on node07".
RUNNERS_UP = 2

# (placements made when it was worked out, refusals by node, nodes per shortfall)
_Explanation = tuple[int, Mapping[str, tuple[str, ...]], Mapping[str, int], tuple[str, ...]]


def place(request: PlacementRequest, nodes: Iterable[NodeSnapshot]) -> Decision:
    """Place one replica on the given nodes, or say node by node why it cannot go anywhere."""
    return place_batch([request], nodes)[0]


def place_batch(
    requests: Iterable[PlacementRequest],
    nodes: Iterable[NodeSnapshot],
    unexplained: Collection[str] = frozenset(),
) -> list[Decision]:
    """Place replicas in order, each seeing the GPUs, RAM and disk earlier ones took.

    A refused request whose ``replica_key`` is in ``unexplained`` is refused without
    working out why (every filter on every node: at 10,000 nodes some 40 ms a request),
    for a caller that knows why already.
    """
    fleet = _Fleet(nodes, frozenset(unexplained))
    return [fleet.place(request) for request in requests]


def _shape(request: PlacementRequest) -> Hashable:
    """Everything in a request that changes how a node filters or scores, but its weights."""
    return (
        request.engine,
        request.engine_version,
        request.pool,
        request.gpus_per_rank,
        request.gpu_memory,
        request.memory,
        request.strategy,
        request.ranks > 1,
        request.memory_basis,
        request.gpu_memory_basis,
        request.waiting_for,
    )


# Every filter but disk, whose answer depends on which weights a node holds: many
# models share a shape, so a node's fit for the shape is worked out once.
_SHAPE_FILTERS = tuple(check for check in FILTERS if check is not disk_free)


@dataclass
class _Queue:
    """The nodes passing one kind of request's filters, best first; stale entries are skipped."""

    request: PlacementRequest  # any request with the same shape and weights evaluates the same
    fits: dict[str, tuple[int, Fit | None]]  # shared by every queue of the shape
    current: dict[str, tuple[int, Candidate]] = field(default_factory=dict)
    heap: list[tuple[tuple[float | str, ...], int]] = field(default_factory=list)

    def offer(self, candidate: Candidate | None, node: str, version: int) -> None:
        if candidate is None:
            self.current.pop(node, None)
            return
        self.current[node] = (version, candidate)
        heapq.heappush(self.heap, (candidate.order, version))

    def pop(self) -> Candidate | None:
        while self.heap:
            order, version = heapq.heappop(self.heap)
            entry = self.current.get(str(order[-1]))
            if entry is not None and entry[0] == version:
                return entry[1]
        return None

    def put_back(self, candidates: Iterable[Candidate]) -> None:
        for candidate in candidates:
            version = self.current[candidate.node][0]
            heapq.heappush(self.heap, (candidate.order, version))


class _Fleet:
    """The batch's own copy of the fleet, changed as replicas are placed on it."""

    def __init__(self, nodes: Iterable[NodeSnapshot], unexplained: frozenset[str]) -> None:
        self.unexplained = unexplained
        self.nodes: dict[str, NodeSnapshot] = {}
        for node in nodes:
            if node.id in self.nodes:
                raise ValueError(f"node {node.id} appears twice in the snapshot")
            self.nodes[node.id] = node
        self.ids = sorted(self.nodes)
        self.versions = dict.fromkeys(self.ids, 0)
        self.fabric_names = {fabric.name for node in self.nodes.values() for fabric in node.fabrics}
        self.queues: dict[Hashable, _Queue] = {}
        self.fits: dict[Hashable, dict[str, tuple[int, Fit | None]]] = {}
        # Refusals depend on the fleet only, so identical requests refused before
        # anything changed share them: fifty replicas of a model nobody can run
        # cost one pass over the fleet, not fifty.
        self.placements = 0
        self.explained: dict[Hashable, _Explanation] = {}

    def place(self, request: PlacementRequest) -> Decision:
        if request.ranks < 1 or request.gpus_per_rank < 0:
            raise ValueError(
                f"replica {request.replica_key}: needs ranks >= 1 and gpus_per_rank >= 0, "
                f"got ranks={request.ranks}, gpus_per_rank={request.gpus_per_rank}"
            )
        queue = self._queue(request)
        available = len(queue.current)
        if request.ranks == 1:
            return self._place_on_one_node(request, queue, available)
        return self._place_across_nodes(request, queue, available)

    def _place_on_one_node(
        self, request: PlacementRequest, queue: _Queue, available: int
    ) -> Decision:
        compared: list[Candidate] = []
        while len(compared) < 1 + RUNNERS_UP and (candidate := queue.pop()) is not None:
            compared.append(candidate)
        queue.put_back(compared[1:])
        if not compared:
            return self._explain(request, available=available)
        chosen = compared[0]
        self._take(chosen, request)
        rank = RankPlacement(0, chosen.node, chosen.gpus)
        return self._placed(request, (rank,), compared, available)

    def _place_across_nodes(
        self, request: PlacementRequest, queue: _Queue, available: int
    ) -> Decision:
        """Walk nodes best first; the first fabric to gather enough of them wins.

        That maximises the score of the weakest rank, which is the one a
        collective waits for.
        """
        popped: list[Candidate] = []
        on_fabric: dict[str, list[Candidate]] = {name: [] for name in self.fabric_names}
        complete: dict[str, list[Candidate]] = {}
        while not complete and (candidate := queue.pop()) is not None:
            popped.append(candidate)
            for name in usable_fabrics(self.nodes[candidate.node]):
                on_fabric[name].append(candidate)
                gathered = self._gathered(on_fabric[name], request)
                if gathered is not None:
                    complete[name] = gathered
        if not complete:
            queue.put_back(popped)
            counts = {name: len(members) for name, members in on_fabric.items()}
            if request.weights_on_rank_0_only and max(counts.values(), default=0) >= request.ranks:
                return self._explain(request, _no_room_for_rank_0(request), available)
            return self._explain(request, fabric_shortfall(request.ranks, counts), available)
        # One node can complete two fabrics at once; the faster wins, then the first by name.
        fabric = min(complete, key=lambda name: (-self._slowest(complete[name], name), name))
        members = complete[fabric]
        chosen = {member.node for member in members}
        others = [candidate for candidate in popped if candidate.node not in chosen]
        queue.put_back(others)
        ranks = tuple(
            RankPlacement(
                rank, member.node, member.gpus, usable_fabrics(self.nodes[member.node])[fabric]
            )
            for rank, member in enumerate(members)
        )
        for rank, member in enumerate(members):
            self._take(member, request, reads_weights=rank == 0 or request.workers_read_weights)
        compared = members + others[:RUNNERS_UP]
        return self._placed(request, ranks, compared, available, fabric)

    def _gathered(
        self, members: list[Candidate], request: PlacementRequest
    ) -> list[Candidate] | None:
        """``request.ranks`` of ``members`` (best first), rank 0 first; None while there
        are too few. Where only rank 0 reads the weights, the others were not filtered
        by disk: rank 0 is the best of them with room for the weights (or holding them)."""
        if len(members) < request.ranks:
            return None
        if not request.weights_on_rank_0_only:
            return members[: request.ranks]
        fits = (m for m in members if disk_free(self.nodes[m.node], request) is None)
        head = next(fits, None)
        if head is None:
            return None
        return [head, *[m for m in members if m is not head][: request.ranks - 1]]

    def _slowest(self, members: list[Candidate], fabric: str) -> float:
        # A collective runs at the speed of its slowest link.
        return min(usable_fabrics(self.nodes[m.node])[fabric].rate_gbps for m in members)

    def _queue(self, request: PlacementRequest) -> _Queue:
        shape = _shape(request)
        signature = (shape, request.weights_key, request.disk, request.spread_key,
                     request.weights_on_rank_0_only)  # fmt: skip
        queue = self.queues.get(signature)
        if queue is None:
            queue = _Queue(request, self.fits.setdefault(shape, {}))
            for node_id in self.ids:
                candidate = self._evaluate(self.nodes[node_id], queue)
                if candidate is not None:
                    queue.current[node_id] = (self.versions[node_id], candidate)
                    queue.heap.append((candidate.order, self.versions[node_id]))
            heapq.heapify(queue.heap)
            self.queues[signature] = queue
        return queue

    def _take(
        self, candidate: Candidate, request: PlacementRequest, reads_weights: bool = True
    ) -> None:
        """Take one rank's GPUs, RAM and disk (if it reads the weights) from the node, and
        re-evaluate it everywhere."""
        node = self.nodes[candidate.node]
        taken = set(candidate.gpus)
        disk_left, fetching = node.disk_free, node.weights_fetching
        if reads_weights and not holds_or_fetches(node, request.weights_key):
            disk_left -= request.disk
            if request.weights_key:
                fetching = fetching | {request.weights_key}
        replicas = dict(node.replicas)
        if request.spread_key:
            replicas[request.spread_key] = replicas.get(request.spread_key, 0) + 1
        node = replace(
            node,
            gpus=tuple(gpu for gpu in node.gpus if gpu.index not in taken),
            ram_free=node.ram_free - request.memory,
            disk_free=disk_left,
            weights_fetching=fetching,
            replicas=MappingProxyType(replicas),
        )
        self.nodes[node.id] = node
        self.versions[node.id] += 1
        self.placements += 1
        for queue in self.queues.values():
            queue.offer(self._evaluate(node, queue), node.id, self.versions[node.id])

    def _evaluate(self, node: NodeSnapshot, queue: _Queue) -> Candidate | None:
        """Score the node if it passes every filter; the first refusal is enough to stop."""
        version = self.versions[node.id]
        cached = queue.fits.get(node.id)
        if cached is None or cached[0] != version:
            passes = all(check(node, queue.request) is None for check in _SHAPE_FILTERS)
            cached = (version, fit_node(node, queue.request) if passes else None)
            queue.fits[node.id] = cached
        fitted = cached[1]
        if fitted is None:
            return None
        # Where only rank 0 reads the weights, any node may be a worker: disk is judged
        # when rank 0 is chosen (``_gathered``).
        if not queue.request.weights_on_rank_0_only and disk_free(node, queue.request) is not None:
            return None
        return score(node, queue.request, fitted)

    def _placed(
        self,
        request: PlacementRequest,
        ranks: tuple[RankPlacement, ...],
        compared: list[Candidate],
        available: int,
        fabric: str = "",
    ) -> Decision:
        return Decision(
            request=request,
            ranks=ranks,
            scores={candidate.node: dict(candidate.scores) for candidate in compared},
            refusals={},
            shortfalls={},
            nodes_total=len(self.ids),
            nodes_available=available,
            fabric=fabric,
        )

    def _explain(
        self, request: PlacementRequest, problem: str = "", available: int = 0
    ) -> Decision:
        """Refuse the request, with every refusal of every node (unless asked not to:
        then with how many nodes passed every filter, ``available``)."""
        if request.replica_key in self.unexplained:
            return Decision(
                request=request, ranks=(), scores={}, refusals={}, shortfalls={},
                nodes_total=len(self.ids), nodes_available=available, explained=False,
            )  # fmt: skip
        key = (_shape(request), request.weights_key, request.disk, request.ranks,
               request.weights_on_rank_0_only)  # fmt: skip
        cached = self.explained.get(key)
        if cached is None or cached[0] != self.placements:
            refusals: dict[str, tuple[str, ...]] = {}
            shortfalls: Counter[str] = Counter()
            examples: list[str] = []
            for node_id in self.ids:
                found = refusals_for(self.nodes[node_id], request)
                if found:
                    refusals[node_id] = tuple(refusal.sentence for refusal in found)
                    if any(shortfalls[r.shortfall] < EXAMPLES_PER_SHORTFALL for r in found):
                        examples.append(node_id)
                    shortfalls.update(refusal.shortfall for refusal in found)
            cached = (
                self.placements,
                MappingProxyType(refusals),
                MappingProxyType(shortfalls),
                tuple(examples),
            )
            self.explained[key] = cached
        _, refusals_by_node, shortfall_counts, examples_shown = cached
        return Decision(
            request=request,
            ranks=(),
            scores={},
            refusals=refusals_by_node,
            shortfalls=shortfall_counts,
            nodes_total=len(self.ids),
            nodes_available=len(self.ids) - len(refusals_by_node),
            problem=problem,
            examples=examples_shown,
        )


def _no_room_for_rank_0(request: PlacementRequest) -> str:
    """Why a replica whose workers read no weights is refused where nodes enough were."""
    return (
        f"needs {request.ranks} nodes on one fabric, one of them with "
        f"{format_bytes(request.disk)} disk free for rank 0's weights (the other ranks read "
        "none); no node on a fabric with enough eligible nodes has it"
    )
