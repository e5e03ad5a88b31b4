"""Heartbeat measurements, against a real process group and a fake NVML."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from fakes.nvml import no_library, pcie_gpus

from agent_worker.discovery.usage import UsageSampler, group_members

# A group leader that forks a child; both spin until killed. The leader prints both pids.
SPINNERS = """
import os, sys
child = os.fork()
if child == 0:
    while True:
        pass
data = bytearray(32 * 1024 * 1024)
print(os.getpid(), child, flush=True)
while True:
    pass
"""


@pytest.fixture
def spinning_group():
    process = subprocess.Popen(
        [sys.executable, "-c", SPINNERS], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        assert process.stdout is not None
        leader, child = (int(pid) for pid in process.stdout.readline().split())
        yield leader, child
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def test_a_shard_is_its_whole_process_group(spinning_group):
    leader, child = spinning_group

    assert group_members({"shard-1": leader}) == {"shard-1": {leader, child}}


def test_a_shards_cores_and_memory_are_measured_across_its_group(spinning_group, tmp_path):
    leader, _ = spinning_group
    sampler = UsageSampler([tmp_path], nvml=no_library())

    sampler.sample({"shard-1": leader})
    time.sleep(0.5)  # real CPU time has to pass between two samples
    usage = sampler.sample({"shard-1": leader})

    shard = usage.shards["shard-1"]
    assert shard.cpu_cores > 0.2
    assert shard.rss > 32 * 1024 * 1024


def test_a_shard_whose_processes_are_gone_is_left_out(tmp_path):
    process = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    process.wait()

    usage = UsageSampler([tmp_path], nvml=no_library()).sample({"shard-1": process.pid})

    assert usage.shards == {}


def test_node_cpu_memory_load_and_disk_are_measured(tmp_path):
    sampler = UsageSampler([tmp_path / "weights", tmp_path / "state"], nvml=no_library())

    sampler.sample()
    usage = sampler.sample()

    assert 0.0 <= usage.cpu_percent <= 100.0
    assert len(usage.load) == 3
    assert usage.memory_total > 0
    assert usage.memory_used + usage.memory_available == usage.memory_total
    assert [fs.path for fs in usage.filesystems] == [str(tmp_path / "weights")]
    assert usage.filesystems[0].free > 0
    assert usage.gpu_memory_used == {}


def test_gpu_memory_is_read_per_gpu_through_one_nvml_session(tmp_path):
    nvml = pcie_gpus(2)
    nvml.gpus[1].memory_used = 7 * 1024**3
    sampler = UsageSampler([tmp_path], nvml=nvml)

    first = sampler.sample()
    nvml.gpus[0].memory_used = 3 * 1024**3
    second = sampler.sample()

    assert first.gpu_memory_used == {0: 512 * 1024**2, 1: 7 * 1024**3}
    assert second.gpu_memory_used == {0: 3 * 1024**3, 1: 7 * 1024**3}
    assert nvml.inits == 1
    sampler.close()
    assert not nvml.open


def test_a_gpu_that_stops_answering_is_left_out_of_that_heartbeat(tmp_path):
    nvml = pcie_gpus(2)
    sampler = UsageSampler([tmp_path], nvml=nvml)
    nvml.gpus[0].lost = True

    assert sampler.sample().gpu_memory_used == {1: 512 * 1024**2}
