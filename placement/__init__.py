"""Placement: frozen snapshots of the fleet in, a decision or every reason out.

Pure Python by design: no Django and nothing else from llmgw, so a decision can
be reproduced from its snapshot and tested as a table.
"""

from placement.decision import Decision, RankPlacement
from placement.fabric import nccl_env
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
from placement.units import format_bytes

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
    "format_bytes",
    "nccl_env",
    "place",
    "place_batch",
    "refusals_for",
]
