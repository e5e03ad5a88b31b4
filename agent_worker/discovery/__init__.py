"""A node describing itself: what it is (`discover`) and how busy it is (`UsageSampler`)."""

from __future__ import annotations

import logging
from pathlib import Path

import pynvml

from agent_worker.discovery.config import DiscoveryConfig, HostSources
from agent_worker.discovery.cpu import cpu_warnings, discover_cpu
from agent_worker.discovery.host import hostname, kernel, os_name
from agent_worker.discovery.infiniband import discover_adapters, usable_fabrics
from agent_worker.discovery.memory import read_memory
from agent_worker.discovery.network import route_address
from agent_worker.discovery.nvidia import Nvml, discover_gpus
from agent_worker.discovery.storage import ensure_weights_dir, measure, resolve_mounts
from agent_worker.discovery.usage import UsageSampler
from protocol.inventory import Inventory

__all__ = ["DiscoveryConfig", "HostSources", "UsageSampler", "discover", "storage_dirs"]

log = logging.getLogger(__name__)


def discover(
    config: DiscoveryConfig, *, host: HostSources | None = None, nvml: Nvml = pynvml
) -> Inventory:
    """Find out what this node is, creating the weights directory on the way.

    Nothing here fails discovery: a part that cannot be found is reported empty, with a
    warning where an operator can do something about it, and every warning is logged.
    """
    host = host or HostSources()
    warnings = ensure_weights_dir(config.weights_dir)
    if config.address:
        address = config.address
    else:
        address, route_warnings = route_address(config.control_planes)
        warnings += route_warnings
    cpu = discover_cpu(host.cpuinfo, host.arch or None)
    warnings += cpu_warnings(cpu)
    # After NVML, whatever it said: a node without NVIDIA cards still has its fabrics.
    nvidia = discover_gpus(nvml)
    warnings += nvidia.warnings
    adapters = discover_adapters(host.infiniband)
    fabrics, fabric_warnings = usable_fabrics(config.fabrics, adapters)
    warnings += fabric_warnings
    for warning in warnings:
        log.warning("%s", warning)
    return Inventory(
        hostname=config.hostname or hostname(),
        address=address,
        os=os_name(host.os_release),
        kernel=kernel(),
        arch=cpu.arch,
        cpu=cpu,
        memory_total=read_memory().total,
        gpus=nvidia.gpus,
        nvidia_driver=nvidia.driver,
        cuda_version=nvidia.cuda_version,
        fabrics=fabrics,
        adapters=adapters,
        weights_dir=str(config.weights_dir),
        filesystems=measure(resolve_mounts(storage_dirs(config))),
        warnings=warnings,
    )


def storage_dirs(config: DiscoveryConfig) -> list[Path]:
    """Return the directories whose filesystems are reported, the weights directory first."""
    return [config.weights_dir, *config.storage_dirs]
