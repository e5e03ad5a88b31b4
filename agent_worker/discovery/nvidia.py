"""NVIDIA GPUs, their driver and their NVLink topology, from NVML.

NVML is the only source of NVLink topology: without it tensor groups fall back to the lowest
free indices, which is right on an NVSwitch board and several times slower on a PCIe box
where bridges pair specific cards.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import pynvml

from protocol.inventory import Gpu

log = logging.getLogger(__name__)

# The pynvml module, or a stand-in with the same functions (tests); untyped upstream.
Nvml = Any


@dataclass
class GpuDiscovery:
    """What NVML said: no GPUs and an empty driver when there is no NVIDIA driver at all."""

    gpus: list[Gpu] = field(default_factory=list)
    driver: str = ""
    cuda_version: str = ""
    warnings: list[str] = field(default_factory=list)


def discover_gpus(nvml: Nvml = pynvml) -> GpuDiscovery:
    """Ask NVML for the GPUs; a node whose NVML will not start is a node without GPUs."""
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        return GpuDiscovery(warnings=_init_warnings(nvml, exc))
    try:
        return _discover(nvml)
    except nvml.NVMLError as exc:
        return GpuDiscovery(warnings=[f"NVML failed while listing GPUs ({exc}); reporting none"])
    finally:
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError as exc:
            log.debug("nvmlShutdown failed: %s", exc)


def _init_warnings(nvml: Nvml, exc: Exception) -> list[str]:
    if isinstance(exc, nvml.NVMLError_LibraryNotFound):
        # No NVIDIA library: a CPU node, which is not worth a word.
        log.info("no NVIDIA library; reporting no GPUs")
        return []
    # A library without a working driver is worth one: a driver upgraded without a reboot
    # (RM version mismatch) leaves a GPU node looking like a CPU node.
    return [f"NVIDIA library present but NVML will not start ({exc}); reporting no GPUs"]


def _discover(nvml: Nvml) -> GpuDiscovery:
    found = GpuDiscovery(driver=_text(nvml.nvmlSystemGetDriverVersion()))
    found.cuda_version = _cuda_version(nvml)
    handles: dict[int, Any] = {}
    gpus: list[Gpu] = []
    for index in range(nvml.nvmlDeviceGetCount()):
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            gpu = Gpu(
                index=index,
                uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
                name=_text(nvml.nvmlDeviceGetName(handle)),
                memory_total=int(memory.total),
                memory_used=int(memory.used),
                pci_bus_id=_text(nvml.nvmlDeviceGetPciInfo(handle).busId),
                compute_capability=_compute_capability(nvml, handle),
            )
        except nvml.NVMLError as exc:
            found.warnings.append(f"GPU {index} does not answer NVML ({exc}); not reported")
            continue
        handles[index] = handle
        gpus.append(gpu)
    peers = nvlink_peers(nvml, handles, {gpu.index: gpu.pci_bus_id for gpu in gpus})
    found.gpus = [gpu.model_copy(update={"nvlink_peers": sorted(peers[gpu.index])}) for gpu in gpus]
    return found


def nvlink_peers(
    nvml: Nvml, handles: dict[int, Any], bus_ids: dict[int, str]
) -> dict[int, set[int]]:
    """Map each GPU index to the GPUs it reaches over an active NVLink.

    A link's far end is matched against the other GPUs' PCI bus ids. GPUs linked to an
    NVSwitch all reach one another. Any NVML error on a link means that link's peer is
    unknown, not that the GPU has none.
    """
    by_bus = {_bus_key(bus_id): index for index, bus_id in bus_ids.items()}
    peers: dict[int, set[int]] = {index: set() for index in handles}
    switched: set[int] = set()
    max_links = int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18))
    for index, handle in handles.items():
        for link in range(max_links):
            try:
                if nvml.nvmlDeviceGetNvLinkState(handle, link) != nvml.NVML_FEATURE_ENABLED:
                    continue
                remote = _bus_key(_text(nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId))
            except nvml.NVMLError:
                continue
            peer = by_bus.get(remote)
            if peer is not None and peer != index:
                peers[index].add(peer)
            elif peer is None and _is_switch(nvml, handle, link):
                switched.add(index)
    for index in switched:
        peers[index] |= switched - {index}
    return peers


def _is_switch(nvml: Nvml, handle: Any, link: int) -> bool:
    try:
        kind = nvml.nvmlDeviceGetNvLinkRemoteDeviceType(handle, link)
    except (nvml.NVMLError, AttributeError):
        return False
    return bool(kind == nvml.NVML_NVLINK_DEVICE_TYPE_SWITCH)


def _bus_key(bus_id: str) -> tuple[int, ...] | str:
    """Compare bus ids by number: NVML writes the domain with 8 digits here and 4 there."""
    try:
        domain, bus, rest = bus_id.split(":")
        device, function = rest.split(".")
        return tuple(int(part, 16) for part in (domain, bus, device, function))
    except ValueError:
        return bus_id.strip().lower()


def _compute_capability(nvml: Nvml, handle: Any) -> str:
    try:
        major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
    except nvml.NVMLError:
        return ""
    return f"{major}.{minor}"


def _cuda_version(nvml: Nvml) -> str:
    try:
        version = int(nvml.nvmlSystemGetCudaDriverVersion())
    except nvml.NVMLError:
        return ""
    return f"{version // 1000}.{version % 1000 // 10}"


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def gpu_process_pids(nvml: Nvml = pynvml) -> set[int]:
    """Pids of every process NVML says holds memory on a GPU; empty without a driver."""
    try:
        nvml.nvmlInit()
    except nvml.NVMLError:
        return set()
    pids: set[int] = set()
    try:
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            for getter in ("nvmlDeviceGetComputeRunningProcesses",
                           "nvmlDeviceGetGraphicsRunningProcesses"):  # fmt: skip
                try:
                    pids.update(process.pid for process in getattr(nvml, getter)(handle))
                except nvml.NVMLError as exc:
                    log.debug("%s failed on GPU %d: %s", getter, index, exc)
    except nvml.NVMLError as exc:
        log.warning("NVML failed while listing GPU processes: %s", exc)
    finally:
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError as exc:
            log.debug("nvmlShutdown failed: %s", exc)
    return pids
