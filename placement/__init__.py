"""Placement: frozen snapshots of the fleet in, a decision or every reason out.

Pure Python by design: no Django, and nothing from llmgw but core's wording of sizes,
so a decision can be reproduced from its snapshot and tested as a table.
"""

from placement.decision import Decision, RankPlacement
from placement.filters import FILTERS, Refusal, refusals_for
from placement.nvlink import GpuGroup, choose_gpus
from placement.scheduler import place, place_batch
from placement.scores import SCORERS, Candidate
from placement.snapshot import (
    CONNECTED,
    DRAINING,
    LOST,
    UNREACHABLE,
    FabricSnapshot,
    GpuSnapshot,
    NodeSnapshot,
    PlacementRequest,
)

__all__ = [
    "CONNECTED",
    "DRAINING",
    "FILTERS",
    "LOST",
    "SCORERS",
    "UNREACHABLE",
    "Candidate",
    "Decision",
    "FabricSnapshot",
    "GpuGroup",
    "GpuSnapshot",
    "NodeSnapshot",
    "PlacementRequest",
    "RankPlacement",
    "Refusal",
    "choose_gpus",
    "place",
    "place_batch",
    "refusals_for",
]
