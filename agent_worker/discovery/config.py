"""What discovery is told rather than finds out."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from agent_worker.discovery.cpu import CPUINFO
from agent_worker.discovery.host import OS_RELEASE
from agent_worker.discovery.infiniband import INFINIBAND


@dataclass(frozen=True)
class DiscoveryConfig:
    """The few facts a node cannot find out; every other field only overrides a finding."""

    weights_dir: Path
    # Tried in order for the route; the first that resolves gives the node's address.
    control_planes: tuple[str, ...] = ()
    # Other directories whose filesystems are reported: state, engine installs.
    storage_dirs: tuple[Path, ...] = ()
    # {fabric: adapters}. Configuration, because OpenSM's default prefix is the same on all.
    fabrics: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    hostname: str = ""
    address: str = ""


@dataclass(frozen=True)
class HostSources:
    """Where the host's facts are read from; tests point these at fakes."""

    cpuinfo: Path = CPUINFO
    os_release: Path = OS_RELEASE
    infiniband: Path = INFINIBAND
    arch: str = ""  # empty: this machine's (platform.machine())
