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
