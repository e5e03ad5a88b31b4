"""What one hostile attempt found, and the table the bench prints.

Each attack module under ``bench/hostile/`` has ``attempts(fleet, scene) -> Iterator[Row]``:
it tries, from a host of the simulated fleet (a node, the router, the services host), to do
what only an authorised party may do, and says whether it was blocked and what answered.
``scene`` names what the runner set up (the replicas, their ports, the hosts' roles).
A row is ``ALLOWED`` when the attempt succeeded: the bench exits 1 on any.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Row:
    attempt: str  # what was tried, in words: "open worker rpc-server and send HELLO"
    source: str  # where from: a host of the fleet ("node-c", "router", "services")
    blocked: bool
    detail: str  # what answered: the refusal, the timeout, or what leaked


def table(rows: Iterable[Row]) -> str:
    """The rows as an aligned text table, ``blocked``/``ALLOWED`` in its own column."""
    rows = list(rows)
    header = ("attempt", "from", "result", "what answered")
    lines = [(r.attempt, r.source, "blocked" if r.blocked else "ALLOWED", r.detail) for r in rows]
    widths = [max(len(str(line[i])) for line in [header, *lines]) for i in range(3)]
    out = []
    for line in [header, *lines]:
        out.append(
            "  ".join(str(cell).ljust(width) for cell, width in zip(line, widths, strict=False))
            + "  "
            + str(line[3])
        )
    return "\n".join(out)


def allowed(rows: Iterable[Row]) -> list[Row]:
    return [row for row in rows if not row.blocked]
