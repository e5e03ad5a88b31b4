"""Which build of an engine version fits this node: its platform, and CUDA when an
NVIDIA driver is loaded and a build's ``cuda>=X.Y`` is within what the driver supports."""

from __future__ import annotations

import platform
from dataclasses import dataclass

from agent_worker.engines.install.errors import InstallError
from protocol.engines import EngineBuild, WantedEngine

MACHINES = {"x86_64": "linux-x86_64", "amd64": "linux-x86_64", "aarch64": "linux-aarch64",
            "arm64": "linux-aarch64"}  # fmt: skip


@dataclass(frozen=True)
class NodeTarget:
    platform: str  # "linux-x86_64", "linux-aarch64"
    cuda_version: str = ""  # the newest CUDA the driver supports ("12.4"); "" without one

    @classmethod
    def of_this_machine(cls, cuda_version: str = "") -> NodeTarget:
        machine = platform.machine().lower()
        return cls(MACHINES.get(machine, f"linux-{machine}"), cuda_version)

    @property
    def cuda(self) -> tuple[int, int] | None:
        if not self.cuda_version:
            return None
        major, _, minor = self.cuda_version.partition(".")
        try:
            return int(major), int(minor.split(".")[0] or 0)
        except ValueError:
            return None


def choose_build(wanted: WantedEngine, target: NodeTarget) -> EngineBuild:
    """CUDA if the driver is there and a build fits it, else CPU; else say why none fits."""
    label = f"{wanted.name} {wanted.version}"
    if not wanted.builds:
        raise InstallError(f"{label} names no builds in the catalog, so there is nothing to "
                           "install; add builds: with an archive for this platform")  # fmt: skip
    on_platform = [b for b in wanted.builds if b.platform == target.platform]
    cuda = target.cuda
    if cuda is not None:
        fitting = [b for b in on_platform if b.accelerator.startswith("cuda")
                   and (b.least_cuda is None or b.least_cuda <= cuda)]  # fmt: skip
        if fitting:
            return fitting[0]
    cpu = [b for b in on_platform if b.accelerator == "cpu"]
    if cpu:
        return cpu[0]
    builds = ", ".join(f"{b.name} for {b.platform}/{b.accelerator}" for b in wanted.builds)
    if on_platform and cuda is None:
        why = "only CUDA builds, and this node has no NVIDIA driver"
    elif on_platform:
        why = f"only CUDA builds this node's driver (CUDA {target.cuda_version}) cannot run"
    else:
        why = f"no build for {target.platform}"
    raise InstallError(f"{label} has {why} (builds: {builds})")
