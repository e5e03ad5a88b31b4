"""A fake `pynvml` for the calls discovery and the usage sampler make.

Errors are the real pynvml exception classes, so code written against the fake catches
exactly what it would catch on a GPU node. Calls before nvmlInit raise Uninitialized, as
the library does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml

GiB = 1024**3
SWITCH = "switch"
# A link's far end: a GPU index, the NVSwitch, or an error NVML raises for that link.
LinkEnd = int | str | type[pynvml.NVMLError]


@dataclass
class FakeGpu:
    name: str = "NVIDIA H100 80GB HBM3"
    memory_total: int = 80 * GiB
    memory_used: int = 512 * 1024**2
    compute_capability: tuple[int, int] = (9, 0)
    links: dict[int, LinkEnd] = field(default_factory=dict)  # active links by link number
    lost: bool = False  # every call about this GPU raises GpuIsLost


class FakeNvml:
    """Behaves like the pynvml module for `gpus`; `init_error` makes nvmlInit fail."""

    NVMLError = pynvml.NVMLError
    NVML_FEATURE_ENABLED = pynvml.NVML_FEATURE_ENABLED
    NVML_FEATURE_DISABLED = pynvml.NVML_FEATURE_DISABLED
    NVML_NVLINK_MAX_LINKS = 18
    NVML_NVLINK_DEVICE_TYPE_GPU = pynvml.NVML_NVLINK_DEVICE_TYPE_GPU
    NVML_NVLINK_DEVICE_TYPE_SWITCH = pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH

    def __init__(
        self,
        gpus: list[FakeGpu],
        init_error: type[pynvml.NVMLError] | None = None,
        driver: str = "550.54.15",
        cuda: int = 12040,
    ) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.driver = driver
        self.cuda = cuda
        self.inits = 0
        self.shutdowns = 0

    def __getattr__(self, name: str) -> Any:
        # NVMLError_LibraryNotFound and friends, exactly as pynvml defines them.
        if name.startswith("NVMLError_"):
            return getattr(pynvml, name)
        raise AttributeError(name)

    @property
    def open(self) -> bool:
        return self.inits > self.shutdowns

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise self.init_error()
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self._check()
        self.shutdowns += 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._check()
        return self.driver

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._check()
        return self.cuda

    def nvmlDeviceGetCount(self) -> int:
        self._check()
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        self._check()
        if not 0 <= index < len(self.gpus):
            raise pynvml.NVMLError_InvalidArgument()
        return index

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        self._gpu(handle)
        return f"GPU-{handle:08x}-0000-0000-0000-000000000000"

    def nvmlDeviceGetName(self, handle: int) -> str:
        return self._gpu(handle).name

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> SimpleNamespace:
        gpu = self._gpu(handle)
        free = gpu.memory_total - gpu.memory_used
        return SimpleNamespace(total=gpu.memory_total, used=gpu.memory_used, free=free)

    def nvmlDeviceGetPciInfo(self, handle: int) -> SimpleNamespace:
        self._gpu(handle)
        return SimpleNamespace(busId=bus_id(handle))

    def nvmlDeviceGetCudaComputeCapability(self, handle: int) -> tuple[int, int]:
        return self._gpu(handle).compute_capability

    def nvmlDeviceGetNvLinkState(self, handle: int, link: int) -> int:
        self._link(handle, link)
        return self.NVML_FEATURE_ENABLED

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: int, link: int) -> SimpleNamespace:
        end = self._link(handle, link)
        if end == SWITCH:
            return SimpleNamespace(busId=b"00000000:C0:00.0")  # bytes, as older bindings return
        # NVML writes a 4-digit domain here and an 8-digit one for the GPU itself.
        return SimpleNamespace(busId=bus_id(int(end)).removeprefix("0000"))

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: int, link: int) -> int:
        end = self._link(handle, link)
        return self.NVML_NVLINK_DEVICE_TYPE_SWITCH if end == SWITCH else 0

    def _check(self) -> None:
        if not self.open:
            raise pynvml.NVMLError_Uninitialized()

    def _gpu(self, handle: int) -> FakeGpu:
        self._check()
        gpu = self.gpus[handle]
        if gpu.lost:
            raise pynvml.NVMLError_GpuIsLost()
        return gpu

    def _link(self, handle: int, link: int) -> int | str:
        end = self._gpu(handle).links.get(link, pynvml.NVMLError_NotSupported)
        if isinstance(end, type):
            raise end()
        return end


def bus_id(index: int) -> str:
    return f"00000000:{0x18 + 0x10 * index:02X}:00.0"


def no_library() -> FakeNvml:
    """A CPU node: no libnvidia-ml at all."""
    return FakeNvml([], init_error=pynvml.NVMLError_LibraryNotFound)


def driver_not_loaded() -> FakeNvml:
    """The library is installed but the kernel module is not loaded."""
    return FakeNvml([], init_error=pynvml.NVMLError_DriverNotLoaded)


def pcie_gpus(count: int) -> FakeNvml:
    """PCIe cards with no NVLink: every link call says NotSupported."""
    return FakeNvml([FakeGpu(name="NVIDIA L40S", memory_total=48 * GiB) for _ in range(count)])


def bridged_pairs(count: int = 8, links_per_bridge: int = 4) -> FakeNvml:
    """A PCIe box where NVLink bridges pair cards 0-1, 2-3, 4-5, 6-7."""
    gpus = [FakeGpu(name="NVIDIA A100-PCIE-40GB", memory_total=40 * GiB) for _ in range(count)]
    for index, gpu in enumerate(gpus):
        gpu.links = {link: index ^ 1 for link in range(links_per_bridge)}
    return FakeNvml(gpus)


def nvswitch_board(count: int = 8) -> FakeNvml:
    """An SXM board where every GPU's links go to NVSwitches."""
    return FakeNvml([FakeGpu(links={link: SWITCH for link in range(18)}) for _ in range(count)])
