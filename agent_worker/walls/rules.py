"""The node's engine walls as nftables rules: who may reach each port of each shard.

One table, ``inet llmgw``, holds everything llmgw adds, so an operator's own rules are
never touched and ``nft list table inet llmgw`` shows all of it. Its ``input`` chain lets
loopback through (the agent's health checks, a rank talking to itself) and sends each
walled port, by a verdict map, to the chain of the shard that holds it. Each shard has a
chain of its own and one named set per address family of (port, source) pairs it admits:
anything else that reaches a walled port is refused, as a closed port would be (a TCP
reset, an ICMP port unreachable). Ports no shard holds are not
matched at all: the node's other services are none of llmgw's business.

``ruleset`` renders the whole table from what the agent holds, as one nft script that
replaces the table atomically: the rules are always exactly the shards it keeps, and a
stale set cannot survive a change. Everything put in the script is checked first
(``check_source``, shard names), since the script is run as root.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass

TABLE = "llmgw"
FAMILY = "inet"
PORTS_MAP = "shard_ports"
# Before the distributions' own filter chains (priority 0): a drop here is final.
PRIORITY = "filter - 10"
_PLAIN_ID = re.compile(r"[A-Za-z0-9_-]{1,40}")


class WallError(Exception):
    """A wall that cannot be kept; the message says why and what to do."""


@dataclass(frozen=True)
class Opening:
    """Ports of one shard that admit only ``allowed`` (addresses or networks) and
    loopback; ``why`` names who they are, for logs."""

    ports: tuple[int, ...]
    allowed: tuple[str, ...]
    why: str


@dataclass(frozen=True)
class ShardWall:
    shard_id: str
    openings: tuple[Opening, ...]

    @property
    def ports(self) -> list[int]:
        return [port for opening in self.openings for port in opening.ports]


def chain_name(shard_id: str) -> str:
    """The shard's chain (and, with a suffix, its sets): its id when that is a plain one
    (shard ids are 32 hex digits), else a digest of it."""
    if _PLAIN_ID.fullmatch(shard_id):
        return f"shard-{shard_id}"
    return "shard-" + hashlib.sha256(shard_id.encode()).hexdigest()[:32]


def set_names(shard_id: str) -> tuple[str, str]:
    """The shard's IPv4 and IPv6 sets of (port, source)."""
    chain = chain_name(shard_id)
    return f"{chain}-v4", f"{chain}-v6"


Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def check_source(source: str) -> Network:
    """``source`` (an address or a network) as a network, or WallError naming it."""
    try:
        return ipaddress.ip_network(source.strip(), strict=False)
    except ValueError:
        raise WallError(f"{source!r} is not an IP address or network") from None


def ruleset(walls: Iterable[ShardWall]) -> str:
    """An nft script that replaces the table with exactly ``walls`` (none: removes it)."""
    walls = list(walls)
    lines = [f"table {FAMILY} {TABLE} {{}}", f"delete table {FAMILY} {TABLE}"]
    if not walls:
        return "\n".join(lines) + "\n"
    owner: dict[int, str] = {}
    for wall in walls:
        for port in wall.ports:
            if port in owner and owner[port] != wall.shard_id:
                raise WallError(
                    f"port {port} is walled for shard {owner[port]} and shard {wall.shard_id}"
                )
            owner[port] = wall.shard_id
    lines.append(f"table {FAMILY} {TABLE} {{")
    verdicts = ", ".join(
        f"{port} : jump {chain_name(shard)}" for port, shard in sorted(owner.items())
    )
    lines += [
        f"  map {PORTS_MAP} {{",
        "    type inet_service : verdict",
        *([f"    elements = {{ {verdicts} }}"] if verdicts else []),
        "  }",
        "  chain input {",
        f"    type filter hook input priority {PRIORITY}; policy accept;",
        '    iifname "lo" accept',
        f"    meta l4proto {{ tcp, udp }} th dport vmap @{PORTS_MAP}",
        "  }",
    ]
    for wall in walls:
        lines += _shard_lines(wall)
    lines.append("}")
    return "\n".join(lines) + "\n"


def _shard_lines(wall: ShardWall) -> list[str]:
    sources: dict[int, set[Network]] = {}
    for opening in wall.openings:
        for port in opening.ports:
            sources.setdefault(port, set()).update(check_source(s) for s in opening.allowed)
    v4: list[str] = []
    v6: list[str] = []
    for port, networks in sources.items():
        # An interval set refuses overlapping elements: a router inside a network an
        # operator also let in is one element, the network.
        fours = [n for n in networks if isinstance(n, ipaddress.IPv4Network)]
        sixes = [n for n in networks if isinstance(n, ipaddress.IPv6Network)]
        v4 += [f"{port} . {_element(n)}" for n in ipaddress.collapse_addresses(fours)]
        v6 += [f"{port} . {_element(n)}" for n in ipaddress.collapse_addresses(sixes)]
    v4_set, v6_set = set_names(wall.shard_id)
    lines = []
    for name, kind, pairs in ((v4_set, "ipv4_addr", v4), (v6_set, "ipv6_addr", v6)):
        lines += [
            f"  set {name} {{",
            f"    type inet_service . {kind}",
            "    flags interval",
            *([f"    elements = {{ {', '.join(pairs)} }}"] if pairs else []),
            "  }",
        ]
    lines += [
        f"  chain {chain_name(wall.shard_id)} {{",
        f"    th dport . ip saddr @{v4_set} accept",
        f"    th dport . ip6 saddr @{v6_set} accept",
        # Refused rather than dropped: what a closed port answers (so nothing more is
        # told), and a router not yet let in fails over at once instead of timing out.
        "    meta l4proto tcp reject with tcp reset",
        "    reject",
        "  }",
    ]
    return lines


def _element(network: Network) -> str:
    if network.num_addresses == 1:
        return str(network.network_address)
    return str(network)
