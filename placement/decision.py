"""What placement answers: where each rank goes, or every reason it could go nowhere."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from placement.snapshot import FabricSnapshot, PlacementRequest

_SINGULAR_VERBS = {"lack": "lacks", "are": "is", "have": "has"}


# A refusal by more nodes than this is kept in brief: a few nodes of each shortfall.
BRIEF_NODES = 10
EXAMPLES_PER_SHORTFALL = 3


@dataclass(frozen=True)
class RankPlacement:
    """One rank of a replica: its node, its GPU indices there, and its side of the fabric."""

    rank: int
    node: str
    gpus: tuple[int, ...]
    # The chosen fabric as this rank's node has it (its own adapters); None for one node.
    fabric: FabricSnapshot | None = None


@dataclass(frozen=True)
class Decision:
    """The answer for one request, shaped like Nomad's AllocMetric.

    Placed: `ranks` is filled, `scores` holds the chosen nodes and the runners-up
    that were compared with them. Refused: `ranks` is empty and `refusals` holds
    every sentence for every node that failed a filter; `shortfalls` counts the
    nodes under each phrase, and `problem` says why the request as a whole
    failed when no single node is to blame (a replica split across fabrics).
    """

    request: PlacementRequest
    ranks: tuple[RankPlacement, ...]
    scores: Mapping[str, Mapping[str, float]]
    refusals: Mapping[str, tuple[str, ...]]
    shortfalls: Mapping[str, int]
    nodes_total: int
    nodes_available: int  # nodes that passed every filter when this was decided
    fabric: str = ""
    problem: str = ""
    # Refused: the first few nodes by id refused under each shortfall (``reasons_in_brief``).
    examples: tuple[str, ...] = ()
    # Refused without working out why, as the caller asked (``place_batch``'s unexplained):
    # its refusals are empty, and the reasons last worked out still hold.
    explained: bool = True

    @property
    def placed(self) -> bool:
        """Say whether every rank has a node."""
        return bool(self.ranks)

    @property
    def summary(self) -> str:
        """Say the outcome in one line.

        "0/7 nodes available: 4 lack free GPU memory, 3 lack engine vllm"
        """
        head = f"{self.nodes_available}/{self.nodes_total} nodes available"
        if self.placed:
            return f"{head}; {self._where()}"
        if not self.explained:
            return f"{head} (why: as last worked out)"
        if not self.nodes_total:
            return f"{head}: no nodes to place on"
        rollup = ", ".join(
            f"{count} {_verb_for(count, phrase)}"
            for phrase, count in sorted(self.shortfalls.items(), key=lambda i: (-i[1], i[0]))
        )
        if rollup and self.problem:
            return f"{head}: {rollup}; {self.problem}"
        if rollup:
            return f"{head}: {rollup}"
        return f"{head}; {self.problem}"

    @property
    def reasons(self) -> list[str]:
        """List every refusal, each sentence prefixed by its node id."""
        lines = [self.problem] if self.problem else []
        for node in sorted(self.refusals):
            lines += [f"{node}: {sentence}" for sentence in self.refusals[node]]
        return lines

    @property
    def reasons_in_brief(self) -> list[str]:
        """``reasons`` for the ``examples`` alone, then a line counting the nodes left out:
        what a refused replica keeps and pages show, whatever the fleet's size (at 2,000
        nodes every sentence is some 200 KB a replica). A refusal by a few nodes is whole."""
        if len(self.refusals) <= BRIEF_NODES:
            return self.reasons
        lines = [self.problem] if self.problem else []
        for node in self.examples:
            lines += [f"{node}: {sentence}" for sentence in self.refusals[node]]
        left = len(self.refusals) - len(self.examples)
        lines.append(f"and {left} more nodes refused it, for the reasons counted above")
        return lines

    def _where(self) -> str:
        places = ", ".join(_describe(rank) for rank in self.ranks)
        if len(self.ranks) == 1:
            return f"placed on {places}"
        return f"placed {len(self.ranks)} ranks on fabric {self.fabric}: {places}"


def _describe(rank: RankPlacement) -> str:
    if not rank.gpus:
        return rank.node
    label = "GPU" if len(rank.gpus) == 1 else "GPUs"
    return f"{rank.node} ({label} {format_indices(rank.gpus)})"


def format_indices(indices: tuple[int, ...]) -> str:
    """Write GPU indices compactly: (0, 1, 2, 3, 6) -> "0-3,6", (4, 5) -> "4,5"."""
    runs: list[list[int]] = []
    for index in sorted(indices):
        if runs and index == runs[-1][-1] + 1:
            runs[-1].append(index)
        else:
            runs.append([index])
    return ",".join(
        ",".join(map(str, run)) if len(run) <= 2 else f"{run[0]}-{run[-1]}" for run in runs
    )


def _verb_for(count: int, phrase: str) -> str:
    if count != 1:
        return phrase
    verb, _, rest = phrase.partition(" ")
    return f"{_SINGULAR_VERBS.get(verb, verb)} {rest}"
