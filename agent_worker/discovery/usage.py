"""How busy a node is, measured between heartbeats.

It runs every five seconds on every node, so it reads only /proc, statvfs and NVML handles
opened once, and keeps its own previous readings: CPU figures are over the interval since the
last sample, not since boot, and not shared with anyone else who calls psutil.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import psutil
import pynvml

from agent_worker.discovery.memory import read_memory
from agent_worker.discovery.nvidia import Nvml
from agent_worker.discovery.storage import measure, resolve_mounts
from protocol.inventory import NodeUsage, ShardUsage

log = logging.getLogger(__name__)

# create_time comes from the boot time, which /proc gives in whole seconds.
_CREATE_TIME_SLACK = 1.0


class UsageSampler:
    """Measure CPU, load, memory, GPU memory, disk and each shard's share; keep one per agent."""

    def __init__(self, dirs: Sequence[Path], nvml: Nvml = pynvml) -> None:
        self._mounts = resolve_mounts(dirs)
        self._nvml = nvml
        self._gpus: dict[int, Any] | None = None  # None until NVML has been tried
        self._lock = threading.Lock()
        self._cpu_times: tuple[float, float] | None = None  # (total, idle) at the last sample
        self._process_cpu: dict[tuple[int, float], float] = {}  # (pid, created) -> CPU seconds
        self._last: tuple[float, float] | None = None  # (monotonic, wall) at the last sample

    def sample(self, shard_pids: Mapping[str, int] | None = None) -> NodeUsage:
        """Measure now; each shard's pid is the leader of the process group it runs in."""
        with self._lock:
            monotonic, wall = time.monotonic(), time.time()
            memory = read_memory()
            usage = NodeUsage(
                cpu_percent=self._cpu_percent(),
                load=psutil.getloadavg(),
                memory_total=memory.total,
                memory_used=memory.used,
                memory_available=memory.available,
                gpu_memory_used=self._gpu_memory_used(),
                filesystems=measure(self._mounts),
                shards=self._shards(shard_pids or {}, monotonic, wall),
            )
            self._last = (monotonic, wall)
            return usage

    def close(self) -> None:
        """Let go of NVML, if it was opened."""
        with self._lock:
            if self._gpus:
                try:
                    self._nvml.nvmlShutdown()
                except self._nvml.NVMLError as exc:
                    log.debug("nvmlShutdown failed: %s", exc)
            self._gpus = None

    def _cpu_percent(self) -> float:
        times = psutil.cpu_times()
        # Guest time is already counted in user time on Linux.
        total = sum(times) - getattr(times, "guest", 0.0) - getattr(times, "guest_nice", 0.0)
        idle = times.idle + getattr(times, "iowait", 0.0)
        previous, self._cpu_times = self._cpu_times, (total, idle)
        if previous is not None:
            total, idle = total - previous[0], idle - previous[1]
        if total <= 0:
            return 0.0
        return min(max(100.0 * (total - idle) / total, 0.0), 100.0)

    def _gpu_memory_used(self) -> dict[int, int]:
        if self._gpus is None:
            self._gpus = self._open_gpus()
        used = {}
        for index, handle in self._gpus.items():
            try:
                used[index] = int(self._nvml.nvmlDeviceGetMemoryInfo(handle).used)
            except self._nvml.NVMLError as exc:
                log.debug("GPU %d memory unreadable: %s", index, exc)
        return used

    def _open_gpus(self) -> dict[int, Any]:
        """Open NVML once for the sampler's life; no NVIDIA library means no GPUs, for good."""
        nvml = self._nvml
        try:
            nvml.nvmlInit()
        except nvml.NVMLError:
            return {}
        handles = {}
        try:
            for index in range(nvml.nvmlDeviceGetCount()):
                try:
                    handles[index] = nvml.nvmlDeviceGetHandleByIndex(index)
                except nvml.NVMLError as exc:
                    log.warning(
                        "GPU %d has no NVML handle, its memory goes unreported: %s", index, exc
                    )
        except nvml.NVMLError as exc:
            log.warning("NVML cannot count GPUs, their memory goes unreported: %s", exc)
        if not handles:
            try:
                nvml.nvmlShutdown()
            except nvml.NVMLError as exc:
                log.debug("nvmlShutdown failed: %s", exc)
        return handles

    def _shards(
        self, shard_pids: Mapping[str, int], monotonic: float, wall: float
    ) -> dict[str, ShardUsage]:
        members = group_members(shard_pids)
        seen: dict[tuple[int, float], float] = {}
        shards = {}
        for shard_id, pids in members.items():
            cores, rss, alive = 0.0, 0, False
            for pid in pids:
                try:
                    process = psutil.Process(pid)
                    with process.oneshot():
                        cpu_times = process.cpu_times()
                        memory = process.memory_info()
                    created = process.create_time()
                except psutil.Error:
                    continue
                alive = True
                key, cpu = (pid, created), cpu_times.user + cpu_times.system
                seen[key] = cpu
                cores += self._cores(key, cpu, monotonic, wall)
                rss += memory.rss
            if alive:
                shards[shard_id] = ShardUsage(cpu_cores=round(cores, 3), rss=rss)
        self._process_cpu = seen
        return shards

    def _cores(self, key: tuple[int, float], cpu: float, monotonic: float, wall: float) -> float:
        """CPU seconds per second for one process over the interval since the last sample."""
        created = key[1]
        if self._last is not None:
            interval = max(monotonic - self._last[0], 1e-3)
            if key in self._process_cpu:
                return max(cpu - self._process_cpu[key], 0.0) / interval
            if created >= self._last[1] - _CREATE_TIME_SLACK:
                # Born since the last sample: all of its CPU time falls in this interval.
                return cpu / interval
        # First sight of an older process: its lifetime average is the best figure there is.
        return cpu / max(wall - created, _CREATE_TIME_SLACK)


def group_members(shard_pids: Mapping[str, int]) -> dict[str, set[int]]:
    """Map each shard to the pids in its process group, plus the leader's descendants.

    The group finds processes whose leader has exited; the descendants find those that
    left the group with setsid (a Ray worker, a daemonising helper).
    """
    shard_of_group = {pid: shard_id for shard_id, pid in shard_pids.items()}
    members: dict[str, set[int]] = {shard_id: set() for shard_id in shard_pids}
    for pid in psutil.pids():
        try:
            group = os.getpgid(pid)
        except OSError:
            continue
        if group in shard_of_group:
            members[shard_of_group[group]].add(pid)
    for shard_id, leader in shard_pids.items():
        members[shard_id].update(_self_and_descendants(leader))
    return members


def _self_and_descendants(pid: int) -> Iterable[int]:
    try:
        process = psutil.Process(pid)
        return [pid, *(child.pid for child in process.children(recursive=True))]
    except psutil.Error:
        return []
