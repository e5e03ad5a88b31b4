"""The node's address: the local one on the route to the control plane; and an
interface's own address (a fabric's IPoIB interface, where its ranks meet)."""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Sequence
from urllib.parse import urlsplit

import psutil

FALLBACK_ADDRESS = "127.0.0.1"


def route_address(control_planes: Sequence[str]) -> tuple[str, list[str]]:
    """Return the address the kernel would send from to reach the control plane, and warnings.

    A UDP connect picks the route and the source address without sending anything, so this
    works before the control plane is up. Each configured address is tried in turn.
    """
    failures = []
    for control_plane in control_planes:
        host, port = split_host_port(control_plane)
        try:
            return _source_address(host, port), []
        except (OSError, UnicodeError) as exc:
            failures.append(f"{control_plane}: {exc}")
    why = "; ".join(failures) if failures else "no control plane address is configured"
    return FALLBACK_ADDRESS, [
        f"no route to the control plane ({why}); reporting {FALLBACK_ADDRESS}; "
        "set the node's address in the agent's configuration"
    ]


def split_host_port(address: str) -> tuple[str, int]:
    """Split "wss://cp:8443/agent/", "cp:8443", "[fd00::1]:8443" or "cp" into host and port."""
    if address.count(":") > 1 and "[" not in address and "://" not in address:
        return address, 443  # a bare IPv6 address: its colons are not a port
    parts = urlsplit(address if "://" in address else f"//{address}")
    try:
        port = parts.port
    except ValueError:
        port = None
    return parts.hostname or address, port or 443


def _source_address(host: str, port: int) -> str:
    family, kind, proto, _, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0]
    with socket.socket(family, kind, proto) as probe:
        probe.connect(sockaddr)
        return str(probe.getsockname()[0])


def interface_address(ifname: str) -> str:
    """The first IPv4 address of interface ``ifname``, else its first IPv6 address that is
    not link-local (those need a scope to be reached); "" when it has none."""
    if not ifname:
        return ""
    addresses = psutil.net_if_addrs().get(ifname, [])
    found = [a.address for a in addresses if a.family in (socket.AF_INET, socket.AF_INET6)]
    usable = []
    for address in found:
        try:
            parsed = ipaddress.ip_address(address.split("%", 1)[0])
        except ValueError:
            continue
        if not parsed.is_link_local:
            usable.append(parsed)
    usable.sort(key=lambda parsed: parsed.version)
    return str(usable[0]) if usable else ""
