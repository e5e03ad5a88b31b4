"""Fake InfiniBand adapters for the node hosts: a sysfs tree each agent reads instead of
/sys/class/infiniband (``infiniband_root:`` in its agent file), and the fabric its agent
file declares. With three nodes or more, the last is alone on ``ib-b``; the rest share
``ib-a``, so a multi-node replica can be placed on one fabric and not across two.
"""

from __future__ import annotations

from dataclasses import dataclass
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


# A shared weights directory: a filer every node declares, mounted on some of them.

FILER_MODEL = "tiny-shared.gguf"
GGUF_MAGIC = b"GGUF"


@dataclass(frozen=True)
class Filer:
    root: Path  # the filer's own files, on the machine's disk
    mount_point: Path  # where each node declares it (`weights: {shared: [...]}`)

    @property
    def mount(self) -> tuple[Path, Path]:
        return self.root, self.mount_point

    @property
    def model(self) -> Path:
        """The model file as a node that mounted the filer sees it."""
        return self.mount_point / FILER_MODEL


def make_filer(directory: Path) -> Filer:
    """A filer holding one small model file, and an empty directory to mount it on."""
    filer = Filer(directory / "filer", directory / "shared-models")
    filer.root.mkdir()
    filer.mount_point.mkdir()
    # A model by the agent's rule (a non-empty .gguf); never started, only listed.
    (filer.root / FILER_MODEL).write_bytes(GGUF_MAGIC + bytes(4092))
    return filer


def declare_shared(agent_file: Path, directory: Path) -> None:
    """``weights: {shared: [directory]}`` in a node's agent file."""
    data = yaml.safe_load(agent_file.read_text()) or {}
    data.setdefault("weights", {})["shared"] = [str(directory)]
    agent_file.write_text(yaml.safe_dump(data, sort_keys=False))
