"""The addresses this machine reaches others from: what a router or control plane tells
the fleet, so that each node's walls admit it to the engines' HTTP ports; and whether a
URL would cross the network in clear (agents and ``onboard`` refuse that by default)."""

from __future__ import annotations

import ipaddress
import os
import socket
from urllib.parse import urlsplit

import psutil

# When nodes see this process connect from an address its interfaces do not have (NAT, a
# proxy in between): those addresses, comma-separated.
ADDRESSES_ENV = "LLMGW_CALLER_ADDRESSES"


def own_addresses(environ: dict[str, str] | None = None) -> list[str]:
    """Every address of this machine's interfaces that another host could see a connection
    come from (not loopback, not link-local), or ``LLMGW_CALLER_ADDRESSES`` when set."""
    environ = dict(os.environ) if environ is None else environ
    override = environ.get(ADDRESSES_ENV, "")
    if override.strip():
        return sorted({a.strip() for a in override.split(",") if a.strip()})
    found = set()
    for addresses in psutil.net_if_addrs().values():
        for entry in addresses:
            if entry.family not in (socket.AF_INET, socket.AF_INET6):
                continue
            try:
                address = ipaddress.ip_address(entry.address.split("%", 1)[0])
            except ValueError:
                continue
            if not (address.is_loopback or address.is_link_local or address.is_unspecified):
                found.add(str(address))
    return sorted(found)


LOOPBACK_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost")


def plaintext_to_network(url: str) -> bool:
    """Whether ``url`` is ws://, http:// or redis:// (a bare host:port being ws://) to an
    address other than loopback; unix sockets and TLS are not."""
    scheme, _, rest = url.partition("://")
    if not rest:
        scheme, rest = "ws", url
    if scheme.lower() not in ("ws", "http", "redis"):
        return False
    host = urlsplit(f"//{rest}").hostname or ""
    if host in LOOPBACK_NAMES:
        return False
    try:
        return not ipaddress.ip_address(host).is_loopback
    except ValueError:
        return True  # a name other than localhost: its address is the network's to say


Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def trusted_networks(entries: list[str], name: str = "LLMGW_TRUSTED_PROXIES") -> list[Network]:
    """The proxies an operator put in front of the control plane, as networks; ValueError
    naming the entry that is neither an address nor a network."""
    networks = []
    for entry in entries:
        try:
            networks.append(ipaddress.ip_network(entry, strict=False))
        except ValueError:
            raise ValueError(
                f"{name}: {entry!r} is neither an address nor a network; "
                "write each proxy as 10.0.0.5 or 10.0.0.0/24, comma-separated"
            ) from None
    return networks


def request_origin(remote_addr: str, forwarded_for: str, proxies: list[Network]) -> str:
    """The address a request came from: REMOTE_ADDR, unless that is one of the trusted
    proxies; then the nearest address in X-Forwarded-For (read from the right, as each
    proxy appends the address it heard from) that is not a trusted proxy itself.

    A client writes what it likes into the header, so nothing further left than the first
    untrusted hop is believed; a hop that is not an address gives the proxy's own."""
    origin = remote_addr or "unknown"
    if not _within(origin, proxies):
        return origin
    for hop in reversed([h.strip() for h in forwarded_for.split(",") if h.strip()]):
        try:
            ipaddress.ip_address(hop)
        except ValueError:
            return origin
        origin = hop
        if not _within(hop, proxies):
            return hop
    return origin


def _within(address: str, networks: list[Network]) -> bool:
    try:
        found = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(found in network for network in networks)
