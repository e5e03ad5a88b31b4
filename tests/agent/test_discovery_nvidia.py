"""NVIDIA GPUs and NVLink topology, against a fake NVML with the real error classes."""

from __future__ import annotations

import pynvml
from fakes import nvml as fakes_nvml
from fakes.nvml import (
    FakeGpu,
    FakeNvml,
    bridged_pairs,
    driver_not_loaded,
    no_library,
    nvswitch_board,
    pcie_gpus,
)
from fakes.sysfs import add_adapter

from agent_worker.discovery import DiscoveryConfig, HostSources, discover
from agent_worker.discovery.nvidia import discover_gpus


def test_a_node_without_the_nvidia_library_has_no_gpus_and_nothing_to_fix():
    nvml = no_library()

    found = discover_gpus(nvml)

    assert found.gpus == []
    assert found.driver == ""
    assert found.warnings == []


def test_a_library_without_a_loaded_driver_is_no_gpus_with_a_warning():
    found = discover_gpus(driver_not_loaded())

    assert found.gpus == []
    assert len(found.warnings) == 1
    assert "Driver Not Loaded" in found.warnings[0]


def test_a_driver_with_no_gpus_reports_its_version_and_shuts_nvml_down():
    nvml = FakeNvml([], driver="550.54.15", cuda=12040)

    found = discover_gpus(nvml)

    assert (found.gpus, found.driver, found.cuda_version) == ([], "550.54.15", "12.4")
    assert nvml.inits == nvml.shutdowns == 1


def test_pcie_gpus_without_nvlink_have_memory_and_no_peers():
    nvml = pcie_gpus(2)

    found = discover_gpus(nvml)

    assert [gpu.index for gpu in found.gpus] == [0, 1]
    first = found.gpus[0]
    assert first.name == "NVIDIA L40S"
    assert first.memory_total == 48 * 1024**3
    assert first.memory_used == 512 * 1024**2
    assert first.uuid.startswith("GPU-")
    assert first.pci_bus_id == "00000000:18:00.0"
    assert first.compute_capability == "9.0"
    assert [gpu.nvlink_peers for gpu in found.gpus] == [[], []]
    assert not nvml.open


def test_bridged_pairs_are_each_others_only_peers():
    found = discover_gpus(bridged_pairs(8))

    assert {gpu.index: gpu.nvlink_peers for gpu in found.gpus} == {
        0: [1],
        1: [0],
        2: [3],
        3: [2],
        4: [5],
        5: [4],
        6: [7],
        7: [6],
    }


def test_gpus_on_an_nvswitch_all_reach_one_another():
    found = discover_gpus(nvswitch_board(8))

    # Compared whole, so a discovery that found no GPU at all cannot pass.
    assert {gpu.index: gpu.nvlink_peers for gpu in found.gpus} == {
        index: [other for other in range(8) if other != index] for index in range(8)
    }


def test_an_nvml_error_on_a_link_leaves_only_that_link_unknown():
    gpus = [FakeGpu(), FakeGpu(), FakeGpu()]
    gpus[0].links = {0: pynvml.NVMLError_Unknown, 1: 2}
    gpus[1].links = {0: pynvml.NVMLError_NoPermission}
    gpus[2].links = {0: 0}

    found = discover_gpus(FakeNvml(gpus))

    assert [gpu.nvlink_peers for gpu in found.gpus] == [[2], [], [0]]


def test_a_lost_gpu_is_left_out_with_a_warning_and_the_rest_reported():
    nvml = pcie_gpus(3)
    nvml.gpus[1].lost = True

    found = discover_gpus(nvml)

    assert [gpu.index for gpu in found.gpus] == [0, 2]
    assert found.warnings == ["GPU 1 does not answer NVML (GPU is lost); not reported"]
    assert not nvml.open


def test_infiniband_is_still_discovered_on_a_node_without_nvidia(tmp_path):
    # The earlier implementation stopped at a missing nvidia-smi, before InfiniBand.
    add_adapter(tmp_path / "ib", "mlx5_0", {1: ("ACTIVE", 200)})
    config = DiscoveryConfig(
        weights_dir=tmp_path / "weights", address="10.0.0.5", fabrics={"ib-a": ("mlx5_0",)}
    )

    inventory = discover(config, host=HostSources(infiniband=tmp_path / "ib"), nvml=no_library())

    assert inventory.gpus == []
    assert inventory.nvidia_driver == ""
    assert [fabric.name for fabric in inventory.fabrics] == ["ib-a"]


def test_discovery_carries_gpus_and_driver_into_the_inventory(tmp_path):
    config = DiscoveryConfig(weights_dir=tmp_path / "weights", address="10.0.0.5")

    inventory = discover(config, host=HostSources(infiniband=tmp_path), nvml=bridged_pairs(2))

    assert inventory.nvidia_driver == "550.54.15"
    assert inventory.cuda_version == "12.4"
    assert [gpu.nvlink_peers for gpu in inventory.gpus] == [[1], [0]]


def test_nvml_failing_mid_listing_reports_no_gpus_and_still_shuts_down():
    class CountFails(FakeNvml):
        def nvmlDeviceGetCount(self) -> int:
            raise pynvml.NVMLError_Unknown()

    nvml = CountFails([FakeGpu()])

    found = discover_gpus(nvml)

    assert found.gpus == []
    assert "NVML failed while listing GPUs" in found.warnings[0]
    assert nvml.inits == nvml.shutdowns == 1


def test_gpu_process_pids_lists_every_gpu_holder():
    from types import SimpleNamespace

    from agent_worker.discovery.nvidia import gpu_process_pids

    fake = fakes_nvml.pcie_gpus(2)
    holders = {
        0: [SimpleNamespace(pid=101)],
        1: [SimpleNamespace(pid=202), SimpleNamespace(pid=101)],
    }
    fake.nvmlDeviceGetComputeRunningProcesses = lambda handle: holders[handle]
    fake.nvmlDeviceGetGraphicsRunningProcesses = lambda handle: []
    assert gpu_process_pids(fake) == {101, 202}


def test_gpu_process_pids_without_a_driver_is_empty():
    from agent_worker.discovery.nvidia import gpu_process_pids

    assert gpu_process_pids(fakes_nvml.no_library()) == set()
