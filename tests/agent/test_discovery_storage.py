"""Storage the agent reports, and the address it reports itself at."""

from __future__ import annotations

from pathlib import Path

import pytest
from fakes.nvml import no_library

from agent_worker.discovery import DiscoveryConfig, HostSources, discover
from agent_worker.discovery.network import FALLBACK_ADDRESS, route_address, split_host_port
from agent_worker.discovery.storage import ensure_weights_dir, measure, mount_of, resolve_mounts
from core.mounts import mount_of as core_mount_of
from core.mounts import read_mounts


def test_the_weights_directory_is_created_by_discovery(tmp_path):
    weights = tmp_path / "var" / "lib" / "llmgw-weights"
    config = DiscoveryConfig(weights_dir=weights, address="10.0.0.5")

    inventory = discover(config, host=HostSources(infiniband=tmp_path), nvml=no_library())

    assert weights.is_dir()
    assert inventory.weights_dir == str(weights)
    assert inventory.weights_filesystem() is not None


def test_a_weights_directory_that_cannot_be_created_is_a_warning_not_a_crash(tmp_path):
    (tmp_path / "a-file").write_text("")  # even root cannot make a directory under a file

    warnings = ensure_weights_dir(tmp_path / "a-file" / "weights")

    assert len(warnings) == 1
    assert str(tmp_path / "a-file" / "weights") in warnings[0]
    assert "fetching weights will fail" in warnings[0]


def test_directories_on_one_mount_are_reported_once_weights_first(tmp_path):
    weights, state = tmp_path / "weights", tmp_path / "state" / "not-yet-created"
    weights.mkdir()

    filesystems = measure(resolve_mounts([weights, state]))

    assert len(filesystems) == 1
    [fs] = filesystems
    assert fs.path == str(weights)
    assert fs.mount == mount_of(tmp_path)
    assert 0 < fs.free <= fs.total


def test_a_bind_mount_is_found_from_the_mount_table(tmp_path):
    # os.path.ismount cannot see a bind mount of the same filesystem; the table can.
    (tmp_path / "volume" / "weights").mkdir(parents=True)
    table = ["/", str(tmp_path / "volume"), str(tmp_path / "vol")]

    assert mount_of(tmp_path / "volume" / "weights", table) == str(tmp_path / "volume")
    assert mount_of(tmp_path / "volume" / "missing" / "deeper", table) == str(tmp_path / "volume")
    assert mount_of(tmp_path / "volumes", table) == "/"


def test_distinct_mounts_are_reported_separately(tmp_path):
    (tmp_path / "a").mkdir()
    pairs = [(tmp_path / "a", str(tmp_path / "a")), (tmp_path, "/")]

    assert [fs.mount for fs in measure(pairs)] == [str(tmp_path / "a"), "/"]


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("wss://cp.example.org:8443/agent/", ("cp.example.org", 8443)),
        ("https://cp.example.org", ("cp.example.org", 443)),
        ("cp.example.org:8000", ("cp.example.org", 8000)),
        ("cp", ("cp", 443)),
        ("10.1.2.3:9000", ("10.1.2.3", 9000)),
        ("[fd00::1]:8443", ("fd00::1", 8443)),
        ("fd00::1", ("fd00::1", 443)),
    ],
    ids=["url", "url-no-port", "host-port", "host", "ipv4", "ipv6-bracketed", "ipv6-bare"],
)
def test_control_plane_addresses_are_split_into_host_and_port(address, expected):
    assert split_host_port(address) == expected


def test_the_address_is_the_one_on_the_route_to_the_control_plane():
    assert route_address(["127.0.0.1:8000"]) == ("127.0.0.1", [])


def test_an_unresolvable_control_plane_is_skipped_for_the_next():
    address, warnings = route_address(["cp.invalid:8000", "localhost:8000"])

    assert address in ("127.0.0.1", "::1")
    assert warnings == []


def test_no_route_falls_back_to_loopback_with_a_warning():
    address, warnings = route_address(["cp.invalid:8000"])

    assert address == FALLBACK_ADDRESS
    assert "cp.invalid:8000" in warnings[0]
    assert "set the node's address" in warnings[0]


def test_configuration_overrides_what_is_found(tmp_path):
    config = DiscoveryConfig(
        weights_dir=tmp_path / "weights",
        control_planes=("cp.invalid:8000",),
        hostname="node05",
        address="192.0.2.5",
    )

    inventory = discover(config, host=HostSources(infiniband=tmp_path), nvml=no_library())

    assert (inventory.hostname, inventory.address) == ("node05", "192.0.2.5")
    assert not any("control plane" in warning for warning in inventory.warnings)


def test_the_mount_table_is_read_with_the_kernels_escapes_undone(tmp_path):
    # The kernel writes a space in a mount point as \040 and a tab as \011.
    table = tmp_path / "mounts"
    table.write_text(
        "/dev/vda / ext4 rw 0 0\n"
        "filer:/export /mnt/model\\040store nfs4 rw 0 0\n"
        "/dev/sdb /mnt/model\\040store/tab\\011dir xfs rw 0 0\n"
    )

    mounts = read_mounts(table)

    assert [m.point for m in mounts] == ["/", "/mnt/model store", "/mnt/model store/tab\tdir"]
    assert core_mount_of(Path("/mnt/model store/gemma.gguf"), mounts) == mounts[1]
    assert core_mount_of(Path("/mnt/model store/tab\tdir/x"), mounts).fstype == "xfs"
    assert read_mounts(tmp_path / "missing") == []  # not Linux, or no /proc: no mounts
