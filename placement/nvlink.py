"""Choosing which GPUs of a node one rank gets, so a tensor-parallel group shares NVLinks.

Lowest free indices are right on an SXM board with NVSwitch and wrong on a PCIe
box where bridges pair specific cards: a group straddling two pairs runs several
times slower and nothing says so. So when NVML reported any peers, the group is
chosen from the topology; only when no GPU has a peer do the lowest indices win.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from itertools import combinations
from math import comb

from placement.snapshot import GpuSnapshot

# Past this many candidate groups (16 GPUs choose 8 is 12,870) a greedy growth
# from every seed replaces the exhaustive search; boards that large are NVSwitch
# boards in practice, where every group is fully connected anyway.
_EXHAUSTIVE_LIMIT = 3432


@dataclass(frozen=True)
class GpuGroup:
    """The GPU indices chosen for one rank, and how well NVLink connects them.

    `score` is the share of GPU pairs in the group joined by a direct NVLink:
    1.0 for a fully connected group (or a single GPU, which needs no link),
    0.0 when no pair is linked or the topology is unknown.
    """

    indices: tuple[int, ...]
    score: float


def choose_gpus(gpus: Sequence[GpuSnapshot], count: int) -> GpuGroup | None:
    """Choose `count` of the given free GPUs for one rank; None when there are too few.

    Prefers, in order: the densest NVLink group (fully connected first), a
    connected one, one that cuts the fewest links to GPUs left free (so intact
    pairs stay whole for the next replica), and the lowest indices.
    """
    if count <= 0:
        return GpuGroup((), 1.0)
    if count > len(gpus):
        return None
    topology = tuple(sorted((gpu.index, gpu.nvlink_peers) for gpu in gpus))
    return _choose(topology, count)


@lru_cache(maxsize=8192)
def _choose(topology: tuple[tuple[int, frozenset[int]], ...], count: int) -> GpuGroup:
    indices = [index for index, _ in topology]
    if not any(peers for _, peers in topology):
        return GpuGroup(tuple(indices[:count]), 1.0 if count == 1 else 0.0)
    position = {index: pos for pos, index in enumerate(indices)}
    links = [
        sum(1 << position[peer] for peer in peers if peer in position) for _, peers in topology
    ]
    everyone = (1 << len(indices)) - 1
    best_mask, best_rank = 0, (-1.0, False, 0)
    for members in _candidate_groups(links, count):
        mask = sum(1 << pos for pos in members)
        rank = _rank(links, members, mask, everyone)
        if rank > best_rank:
            best_mask, best_rank = mask, rank
    chosen = tuple(index for pos, index in enumerate(indices) if best_mask >> pos & 1)
    return GpuGroup(chosen, 1.0 if count == 1 else best_rank[0])


def _candidate_groups(links: list[int], count: int) -> Iterable[tuple[int, ...]]:
    size = len(links)
    if comb(size, count) <= _EXHAUSTIVE_LIMIT:
        return combinations(range(size), count)
    return (_grow(links, seed, count) for seed in range(size))


def _grow(links: list[int], seed: int, count: int) -> tuple[int, ...]:
    """Grow a group from one GPU, each step adding the GPU most linked into it."""
    members, mask = [seed], 1 << seed
    while len(members) < count:
        best = max(
            (pos for pos in range(len(links)) if not mask >> pos & 1),
            key=lambda pos: ((links[pos] & mask).bit_count(), -pos),
        )
        members.append(best)
        mask |= 1 << best
    return tuple(sorted(members))


def _rank(
    links: list[int], members: tuple[int, ...], mask: int, everyone: int
) -> tuple[float, bool, int]:
    inside = sum((links[pos] & mask).bit_count() for pos in members) // 2
    cut = sum((links[pos] & everyone & ~mask).bit_count() for pos in members)
    pairs = len(members) * (len(members) - 1) // 2
    density = inside / pairs if pairs else 1.0
    return (density, _connected(links, members[0], mask), -cut)


def _connected(links: list[int], start: int, mask: int) -> bool:
    """Say whether NVLinks inside the group reach every member from `start`."""
    reached = frontier = 1 << start
    while frontier:
        grown = 0
        for pos, peers in enumerate(links):
            if frontier >> pos & 1:
                grown |= peers
        frontier = grown & mask & ~reached
        reached |= frontier
    return reached == mask
