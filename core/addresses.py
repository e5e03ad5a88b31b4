"""The addresses this machine reaches others from: what a router or control plane tells
the fleet, so that each node's walls admit it to the engines' HTTP ports."""

from __future__ import annotations

import ipaddress
import os
import socket

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
