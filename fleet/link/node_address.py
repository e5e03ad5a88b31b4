"""Whether the address a node reports is an address of that node.

The router posts its replicas' prompts, with their secret, to ``http://ADDRESS:port``, and
engines bind that address: a node that reports a name, the metadata service's link-local
address or another host's address would turn the router (and its engines) against
whatever answers there. So the address must be an IP literal of a single host, and the
one its link comes from, unless that link comes through a proxy named in
``LLMGW_LINK_PROXIES`` (where only the proxy's address is seen), or from an unknown peer.
"""

from __future__ import annotations

import ipaddress

from django.conf import settings

_FIX = (
    "set address: in its agent file (LLMGW_AGENT_ADDRESS) to the node's own IP address, or "
    "leave it out to take the source address of the node's route to the control plane"
)


def address_problem(node_id: str, address: str, peer: str) -> str:
    """Why ``address`` is not node ``node_id``'s own, seen from a link from ``peer``; ""
    when it is. ``peer`` is "unknown" when the server could not say."""
    said = f"node {node_id} reports its address as {address!r}"
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return f"{said}, which is not an IP address; {_FIX}"
    if ip.is_unspecified or ip.is_multicast or ip.is_reserved:
        return f"{said}, which is no one host's address; {_FIX}"
    if ip.is_link_local:
        return f"{said}, a link-local address (the metadata service's, say); {_FIX}"
    if peer == "unknown" or peer in settings.LINK_PROXIES:
        return ""
    try:
        seen = ipaddress.ip_address(peer)
    except ValueError:
        return ""
    if _same(ip, seen):
        return ""
    return (
        f"{said}, but its link comes from {peer}; {_FIX}; a control plane behind a proxy "
        "names the proxy's address in LLMGW_LINK_PROXIES"
    )


def _same(a: ipaddress.IPv4Address | ipaddress.IPv6Address, b: object) -> bool:
    # An IPv4 node seen over a dual-stack socket shows as ::ffff:a.b.c.d.
    mapped = getattr(b, "ipv4_mapped", None)
    return a == b or (mapped is not None and a == mapped)
