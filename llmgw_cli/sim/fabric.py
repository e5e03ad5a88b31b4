"""Fake InfiniBand adapters for the node hosts: a sysfs tree each agent reads instead of
/sys/class/infiniband (``infiniband_root:`` in its agent file), and the fabric its agent
file declares. With three nodes or more, the last is alone on ``ib-b``; the rest share
``ib-a``, so a multi-node replica can be placed on one fabric and not across two.
"""

from __future__ import annotations

from pathlib import Path

import yaml

ADAPTER = "mlx5_0"
RATE = "200 Gb/sec (4X HDR)"


def fabric_of(index: int, count: int) -> str:
    """The fabric of node ``index`` (from 1) among ``count`` nodes."""
    return "ib-b" if count >= 3 and index == count else "ib-a"


def write_adapter(root: Path) -> None:
    """One adapter with one ACTIVE port, as the kernel lays it out."""
    port = root / ADAPTER / "ports" / "1"
    port.mkdir(parents=True)
    (port / "state").write_text("4: ACTIVE\n")
    (port / "phys_state").write_text("5: LinkUp\n")
    (port / "link_layer").write_text("InfiniBand\n")
    (port / "rate").write_text(f"{RATE}\n")


def declare_fabric(agent_file: Path, fabric: str, root: Path) -> None:
    """What an operator writes in a node's agent.yaml: its fabric, and (simulated) where
    its adapters are."""
    data = yaml.safe_load(agent_file.read_text()) or {}
    data["fabrics"] = {fabric: [ADAPTER]}
    data["infiniband_root"] = str(root)
    agent_file.write_text(yaml.safe_dump(data, sort_keys=False))
