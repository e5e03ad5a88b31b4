"""Fabrics for a replica that spans nodes: one fabric for all ranks, each with its adapters.

Fabrics are not connected to one another, so every rank must sit on the same
one, with an adapter on it that carries traffic. An adapter that is declared
but absent, or present with no ACTIVE port, makes the replica start, pass its
health checks and hang on its first all-reduce. Each rank is given its own
node's side of the fabric; the agent tells NCCL exactly those adapters.
"""

from __future__ import annotations

from collections.abc import Mapping

from core.humanize import plural
from placement.snapshot import FabricSnapshot, NodeSnapshot


def usable_fabrics(node: NodeSnapshot) -> dict[str, FabricSnapshot]:
    """Return the node's fabrics that can carry a collective, by name."""
    return {fabric.name: fabric for fabric in node.fabrics if fabric.usable}


def fabric_shortfall(ranks: int, eligible: Mapping[str, int]) -> str:
    """Say why no fabric can hold the replica: how many eligible nodes each one has.

    "needs 2 nodes on one fabric; ib-a has 1 eligible node, ib-b has 0"
    """
    if not eligible:
        return f"needs {ranks} nodes on one fabric; no node has an active fabric"
    ordered = sorted(eligible.items(), key=lambda item: (-item[1], item[0]))
    (first, count), rest = ordered[0], ordered[1:]
    parts = [f"{first} has {count} eligible {plural(count, 'node')}"]
    parts += [f"{name} has {count}" for name, count in rest]
    return f"needs {ranks} nodes on one fabric; {', '.join(parts)}"
