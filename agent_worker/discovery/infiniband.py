"""InfiniBand adapters from sysfs, and which declared fabrics they can really carry.

Fabric membership is configuration, because OpenSM's default subnet prefix is the same on
every fabric. What configuration cannot be trusted with is whether the adapter is there and
has an ACTIVE port: a typo, or a card that enumerated differently after a reboot, or a link
with no subnet manager (INIT) passes every health check and hangs the first all-reduce.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import cast, get_args

from agent_worker.discovery.network import interface_address
from protocol.inventory import AdapterPort, FabricAdapter, PortState, UsableFabric

INFINIBAND = Path("/sys/class/infiniband")

_STATES = set(get_args(PortState))
_RATE = re.compile(r"([\d.]+)\s*Gb/sec")
# What a port that is not ACTIVE most likely means, for the operator reading the warning.
_HINTS = {
    "INIT": "no subnet manager?",
    "ARMED": "the subnet manager has not activated it yet?",
    "DOWN": "cable unplugged or switch port down?",
    "ACTIVE_DEFER": "the link is recovering",
    "UNKNOWN": "its state cannot be read",
}


def discover_adapters(root: Path = INFINIBAND) -> list[FabricAdapter]:
    """List every adapter under `root` with its ports; none when there is no such directory."""
    try:
        devices = sorted(path for path in root.iterdir() if path.is_dir())
    except OSError:
        return []
    return [
        FabricAdapter(name=device.name, ports=_ports(device), interfaces=_interfaces(device))
        for device in devices
    ]


def usable_fabrics(
    declared: Mapping[str, Sequence[str]],
    adapters: Sequence[FabricAdapter],
    address_of: Callable[[str], str] = interface_address,
) -> tuple[list[UsableFabric], list[str]]:
    """Return the declared fabrics this node can carry traffic on, and why the rest cannot.

    Only adapters that are present and have an ACTIVE port are advertised; a fabric left with
    none is not advertised at all. Its rate is the slowest active link, since a collective
    runs at the speed of its slowest. Its socket interface's address (``address_of``) is
    where a rank that listens for the others binds: the fabric, not the shared network.
    """
    found = {adapter.name: adapter for adapter in adapters}
    fabrics, warnings = [], []
    for name, wanted in declared.items():
        usable = []
        for adapter_name in wanted:
            adapter = found.get(adapter_name)
            if adapter is None:
                warnings.append(
                    f"fabric {name}: adapter {adapter_name} is not on this node ({_found(found)})"
                )
            elif not adapter.active_ports():
                warnings.append(
                    f"fabric {name}: adapter {adapter_name} has no ACTIVE port ({_why(adapter)})"
                )
            else:
                usable.append(adapter)
        if not usable:
            warnings.append(f"fabric {name}: no usable adapter on this node; not advertised")
            continue
        rates = [p.rate_gbps for a in usable for p in a.active_ports() if p.rate_gbps is not None]
        ifname = next((i for a in usable for i in a.interfaces), "")
        fabrics.append(
            UsableFabric(
                name=name,
                adapters=[adapter.name for adapter in usable],
                rate_gbps=min(rates) if rates else None,
                socket_ifname=ifname,
                socket_address=address_of(ifname),
            )
        )
    return fabrics, warnings


def _ports(device: Path) -> list[AdapterPort]:
    try:
        numbers = sorted(
            int(path.name) for path in (device / "ports").iterdir() if path.name.isdigit()
        )
    except OSError:
        return []
    ports = []
    for number in numbers:
        port = device / "ports" / str(number)
        ports.append(
            AdapterPort(
                number=number,
                state=_state(_read(port / "state")),
                rate_gbps=_rate(_read(port / "rate")),
                link_layer=_read(port / "link_layer"),
            )
        )
    return ports


def _interfaces(device: Path) -> list[str]:
    """Network interfaces on the adapter (IPoIB, or the RoCE netdev) that are up."""
    try:
        netdevs = sorted((device / "device" / "net").iterdir())
    except OSError:
        return []
    return [netdev.name for netdev in netdevs if _read(netdev / "operstate") == "up"]


def _state(text: str) -> PortState:
    """Parse "4: ACTIVE" into "ACTIVE"."""
    state = text.rpartition(":")[2].strip().upper()
    return cast(PortState, state) if state in _STATES else "UNKNOWN"


def _rate(text: str) -> float | None:
    """Parse "100 Gb/sec (4X EDR)" into 100.0."""
    match = _RATE.search(text)
    return float(match.group(1)) if match else None


def _why(adapter: FabricAdapter) -> str:
    if not adapter.ports:
        return "it has no ports"
    return "; ".join(
        f"port {port.number} is {port.state}: {_HINTS[port.state]}" for port in adapter.ports
    )


def _found(found: Mapping[str, FabricAdapter]) -> str:
    if not found:
        return "no InfiniBand adapters found"
    return "found: " + ", ".join(sorted(found))


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""
