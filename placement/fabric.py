"""Fabrics for a replica that spans nodes: one fabric for all ranks, and NCCL told which.

Fabrics are not connected to one another, so every rank must sit on the same
one, with an adapter on it that carries traffic. An adapter that is declared
but absent, or present with no ACTIVE port, makes the replica start, pass its
health checks and hang on its first all-reduce.
"""

from __future__ import annotations

from collections.abc import Mapping

from core.humanize import plural
from placement.snapshot import FabricSnapshot, NodeSnapshot


def usable_fabrics(node: NodeSnapshot) -> dict[str, FabricSnapshot]:
    """Return the node's fabrics that can carry a collective, by name."""
    return {fabric.name: fabric for fabric in node.fabrics if fabric.usable}


def nccl_env(fabric: FabricSnapshot) -> dict[str, str]:
    """Write the NCCL settings for one node's side of a fabric.

    NCCL matches these names as prefixes unless the list starts with "=", and
    "mlx5_1" as a prefix also takes mlx5_10 to mlx5_19, which may sit on another
    fabric. So the lists are exact, and name only adapters with an ACTIVE port.
    """
    env = {"NCCL_IB_DISABLE": "0", "NCCL_IB_HCA": "=" + ",".join(fabric.adapters)}
    if fabric.socket_ifname:
        env["NCCL_SOCKET_IFNAME"] = "=" + fabric.socket_ifname
    return env


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
