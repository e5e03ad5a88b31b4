"""What one hostile attempt found, and the table the bench prints.

Each attack module under ``bench/hostile/`` has ``attempts(fleet, scene) -> Iterator[Row]``:
it tries, from a host of the simulated fleet (a node, the router, the services host), to do
what only an authorised party may do, and says whether it was blocked and what answered.
``scene`` names what the runner set up (the replicas, their ports, the hosts' roles).
A row is ``ALLOWED`` when the attempt succeeded: the bench exits 1 on any.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
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


def attempt(what: str, source: str, attack: Callable[[], tuple[bool, str]]) -> Row:
    """Run ``attack`` (it says whether it was blocked, and what answered) as one row; an
    attempt that could not be made at all is ``ALLOWED`` with what stopped it, so a broken
    attempt never reads as a wall that holds."""
    try:
        blocked, detail = attack()
    except Exception as exc:
        blocked, detail = False, f"the attempt could not be made: {type(exc).__name__}: {exc}"
    return Row(what, source, blocked, detail)


def run_alone(attempts: Callable[..., Iterable[Row]]) -> None:
    """One attack module's ``attempts`` against a running `llmgw sim up`: its table, and
    exit 1 on any ``ALLOWED`` row."""
    import os
    import sys
    from pathlib import Path

    from llmgw_cli.sim.state import Fleet, state_dir

    running = Fleet.load(Path(os.environ.get("LLMGW_SIM_DIR") or state_dir()))
    if running is None:
        sys.exit("no simulated fleet is running: start one with `llmgw sim up`")
    found = list(attempts(running, {}))
    print(table(found))
    sys.exit(1 if allowed(found) else 0)
