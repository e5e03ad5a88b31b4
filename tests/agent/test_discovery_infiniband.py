"""InfiniBand adapters from a fake sysfs, and which declared fabrics are advertised."""

from __future__ import annotations

import logging

from fakes.nvml import no_library
from fakes.sysfs import add_adapter

from agent_worker.discovery import DiscoveryConfig, HostSources, discover
from agent_worker.discovery.infiniband import discover_adapters, usable_fabrics


def fabrics_for(root, declared):
    return usable_fabrics(declared, discover_adapters(root))


def test_adapters_ports_states_and_rates_are_read(tmp_path):
    add_adapter(tmp_path, "mlx5_0", {1: ("ACTIVE", 100), 2: ("INIT", 100)}, {"ib0": "up"})
    add_adapter(tmp_path, "mlx5_1", {1: ("ACTIVE", 2.5)}, link_layer="Ethernet")

    adapters = discover_adapters(tmp_path)

    assert [adapter.name for adapter in adapters] == ["mlx5_0", "mlx5_1"]
    first, second = adapters
    assert [(p.number, p.state, p.rate_gbps) for p in first.ports] == [
        (1, "ACTIVE", 100.0),
        (2, "INIT", 100.0),
    ]
    assert first.interfaces == ["ib0"]
    assert second.ports[0].rate_gbps == 2.5
    assert second.ports[0].link_layer == "Ethernet"


def test_a_node_without_infiniband_has_no_adapters(tmp_path):
    assert discover_adapters(tmp_path / "absent") == []


def test_a_fabric_of_active_adapters_runs_at_its_slowest_link(tmp_path):
    add_adapter(tmp_path, "mlx5_0", {1: ("ACTIVE", 200)}, {"ib0": "down"})
    add_adapter(tmp_path, "mlx5_1", {1: ("ACTIVE", 100)}, {"ib1": "up"})

    fabrics, warnings = fabrics_for(tmp_path, {"ib-a": ["mlx5_0", "mlx5_1"]})

    assert warnings == []
    [fabric] = fabrics
    assert fabric.name == "ib-a"
    assert fabric.adapters == ["mlx5_0", "mlx5_1"]
    assert fabric.rate_gbps == 100.0
    assert fabric.socket_ifname == "ib1"


def test_a_declared_adapter_missing_from_the_node_is_not_advertised(tmp_path):
    add_adapter(tmp_path, "mlx5_0", {1: ("ACTIVE", 100)})

    fabrics, warnings = fabrics_for(tmp_path, {"ib-a": ["mlx5_0", "mlx5_1"]})

    assert [fabric.adapters for fabric in fabrics] == [["mlx5_0"]]
    assert warnings == ["fabric ib-a: adapter mlx5_1 is not on this node (found: mlx5_0)"]


def test_an_adapter_with_no_active_port_is_not_advertised_and_says_why(tmp_path):
    add_adapter(tmp_path, "mlx5_0", {1: ("INIT", 100)})
    add_adapter(tmp_path, "mlx5_1", {1: ("ACTIVE", 100)})

    fabrics, warnings = fabrics_for(tmp_path, {"ib-a": ["mlx5_0", "mlx5_1"]})

    assert [fabric.adapters for fabric in fabrics] == [["mlx5_1"]]
    assert warnings == [
        "fabric ib-a: adapter mlx5_0 has no ACTIVE port (port 1 is INIT: no subnet manager?)"
    ]


def test_a_fabric_with_no_usable_adapter_is_not_advertised(tmp_path):
    add_adapter(tmp_path, "mlx5_0", {1: ("DOWN", None), 2: ("INIT", 100)})

    fabrics, warnings = fabrics_for(tmp_path, {"ib-a": ["mlx5_0"], "ib-b": ["mlx5_9"]})

    assert fabrics == []
    assert warnings == [
        "fabric ib-a: adapter mlx5_0 has no ACTIVE port (port 1 is DOWN: cable unplugged or "
        "switch port down?; port 2 is INIT: no subnet manager?)",
        "fabric ib-a: no usable adapter on this node; not advertised",
        "fabric ib-b: adapter mlx5_9 is not on this node (found: mlx5_0)",
        "fabric ib-b: no usable adapter on this node; not advertised",
    ]


def test_an_adapter_active_on_its_second_port_is_usable(tmp_path):
    add_adapter(tmp_path, "mlx5_0", {1: ("DOWN", None), 2: ("ACTIVE", 400)})

    fabrics, warnings = fabrics_for(tmp_path, {"ib-a": ["mlx5_0"]})

    assert warnings == []
    assert [(fabric.adapters, fabric.rate_gbps) for fabric in fabrics] == [(["mlx5_0"], 400.0)]


def test_an_unreadable_rate_is_unknown_rather_than_zero(tmp_path):
    add_adapter(tmp_path, "mlx5_0", {1: ("ACTIVE", None)})

    [fabric], _ = fabrics_for(tmp_path, {"ib-a": ["mlx5_0"]})

    assert fabric.rate_gbps is None


def test_discovery_logs_each_fabric_problem_and_lists_every_adapter(tmp_path, caplog):
    add_adapter(tmp_path / "ib", "mlx5_0", {1: ("INIT", 100)})
    add_adapter(tmp_path / "ib", "mlx5_2", {1: ("ACTIVE", 100)})  # on no declared fabric
    config = DiscoveryConfig(
        weights_dir=tmp_path / "weights",
        address="10.0.0.5",
        fabrics={"ib-a": ("mlx5_0", "mlx5_1")},
    )

    with caplog.at_level(logging.WARNING):
        inventory = discover(
            config, host=HostSources(infiniband=tmp_path / "ib"), nvml=no_library()
        )

    assert inventory.fabrics == []
    assert [adapter.name for adapter in inventory.adapters] == ["mlx5_0", "mlx5_2"]
    logged = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    for reason in (
        "fabric ib-a: adapter mlx5_0 has no ACTIVE port (port 1 is INIT: no subnet manager?)",
        "fabric ib-a: adapter mlx5_1 is not on this node (found: mlx5_0, mlx5_2)",
    ):
        assert reason in inventory.warnings
        assert reason in logged


def test_a_fabrics_socket_interface_gives_the_address_where_its_ranks_meet(tmp_path):
    add_adapter(tmp_path, "mlx5_0", {1: ("ACTIVE", 200)}, {"ib0": "up"})
    addresses = {"ib0": "192.168.7.4"}

    [fabric], _ = usable_fabrics({"ib-a": ["mlx5_0"]}, discover_adapters(tmp_path),
                                 address_of=lambda name: addresses.get(name, ""))  # fmt: skip

    assert (fabric.socket_ifname, fabric.socket_address) == ("ib0", "192.168.7.4")


def test_an_interfaces_address_is_its_ipv4_one_else_a_routable_ipv6_one():
    from agent_worker.discovery.network import interface_address

    assert interface_address("lo") == "127.0.0.1"
    assert interface_address("no-such-interface") == ""
    assert interface_address("") == ""
