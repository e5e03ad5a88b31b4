"""Discovery on the machine the tests run on, with the real NVML, /proc and sysfs."""

from __future__ import annotations

import pynvml
import pytest
from pydantic import ValidationError

from agent_worker.discovery import DiscoveryConfig, discover
from agent_worker.discovery.host import os_name
from protocol.inventory import Inventory


def nvml_starts() -> bool:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


def test_this_machine_describes_itself(tmp_path):
    weights = tmp_path / "weights"
    config = DiscoveryConfig(weights_dir=weights, control_planes=("127.0.0.1:8000",))

    inventory = discover(config)

    assert inventory.hostname
    assert inventory.address == "127.0.0.1"
    assert inventory.cpu.cores > 0
    assert inventory.memory_total > 0
    assert inventory.os and inventory.kernel and inventory.arch
    assert weights.is_dir()
    assert inventory.weights_filesystem() is not None
    if nvml_starts():  # a GPU machine: the real NVML must have answered
        assert inventory.gpus and inventory.nvidia_driver
    else:
        assert inventory.gpus == []
        assert inventory.nvidia_driver == ""


def test_the_inventory_survives_the_wire_and_refuses_unknown_fields(tmp_path):
    inventory = discover(DiscoveryConfig(weights_dir=tmp_path, address="10.0.0.5"))
    message = inventory.model_dump(mode="json")

    assert Inventory.model_validate_json(inventory.model_dump_json()) == inventory

    message["cpu"]["cores_typo"] = 4
    with pytest.raises(ValidationError, match="cpu.cores_typo"):
        Inventory.model_validate(message)


def test_the_os_is_the_distributions_pretty_name(tmp_path):
    os_release = tmp_path / "os-release"
    os_release.write_text('NAME="Ubuntu"\nPRETTY_NAME="Ubuntu 24.04.1 LTS"\nID=ubuntu\n')

    assert os_name(os_release) == "Ubuntu 24.04.1 LTS"
    assert os_name(tmp_path / "missing")  # the platform's own words instead
