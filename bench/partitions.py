"""The simulated fleet through partitions P1-P7 under a streaming load: one row each.

    sudo .venv/bin/python -m bench.partitions          # the liveness timers as shipped
    sudo .venv/bin/python -m bench.partitions --short  # make test's: unreachable 4 s, lost 20 s

Three node hosts, both control planes, the router and the services host, each in a
network namespace of its own (llmgw_cli/sim); two replicas of the demo model; eight
streaming clients on the services host. Per scenario: requests sent and failed (with
reasons), the longest request, seconds to detect the fault and to recover from its
heal, engines restarted that should have kept running, nodes wrongly marked lost, rows
that disagree with the agents, and every broken invariant in words. Exits 1 when any
scenario broke one. The fleet is removed at the end, whatever happened.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from bench import partition_scenarios as scenarios
from bench import sim
from bench.report import print_rows
from llmgw_cli.sim.fleet import simulated_fleet

NODES = 3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--short",
        action="store_true",
        help="short liveness timers (unreachable 4 s, lost 20 s, hold 10 s)",
    )
    parser.add_argument("--only", default="", help="scenarios to run, e.g. P1,P3")
    parser.add_argument("--clients", type=int, default=scenarios.CLIENTS)
    parser.add_argument(
        "--pause", type=float, default=0.0, help="seconds each client waits after an answer"
    )
    parser.add_argument("--dir", type=Path, help="the fleet's state directory (kept)")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument(
        "--replace",
        action="store_true",
        help="take down a simulated fleet running on this machine (else refused)",
    )
    options = parser.parse_args()
    reason = sim.refusal()
    if reason:
        print(f"partitions: {reason}", file=sys.stderr)
        return 2
    timers = scenarios.SHORT_TIMERS if options.short else scenarios.DEFAULT_TIMERS
    wanted = [p.strip() for p in options.only.split(",") if p.strip()]
    names = [n for n in scenarios.SCENARIOS if not wanted or n.split()[0] in wanted]
    directory = options.dir or Path(tempfile.mkdtemp(prefix="llmgw-partitions-"))
    print(
        f"timers: unreachable {timers.unreachable}s, lost {timers.lost}s, mass-silence hold "
        f"{timers.hold}s, heartbeat {timers.heartbeat}s; {NODES} nodes, "
        f"{scenarios.REPLICAS} replicas, {options.clients} streaming clients"
        + (f" pausing {options.pause:g}s between requests" if options.pause else ""),
        flush=True,
    )
    rows = []
    started = time.monotonic()
    tuning = timers.tuning(NODES)
    with simulated_fleet(NODES, directory, tuning=tuning, replace=options.replace) as fleet:
        print(f"fleet up in {time.monotonic() - started:.0f}s", flush=True)
        key = sim.api_key(fleet)
        for name in names:
            began = time.monotonic()
            row = scenarios.run(fleet, name, timers, key, options.clients, options.pause)
            print(
                f"{name}: {time.monotonic() - began:.0f}s"
                + (f", skipped: {row.skipped}" if row.skipped else ""),
                flush=True,
            )
            rows.append(row)
            if options.json:  # after each one: a crash later keeps what ran
                options.json.write_text(json.dumps([asdict(r) for r in rows], indent=2))
    print_table(rows)
    return 1 if any(r.violations for r in rows) else 0


def seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def print_table(rows: list[scenarios.Row]) -> None:
    header = ("scenario", "sent", "failed", "longest s", "detect s", "recover s", "restarted",
              "lost", "disagree")  # fmt: skip
    print()
    # A skipped scenario's row is the reason in one cell.
    print_rows(
        header,
        (
            (row.scenario, f"skipped: {row.skipped}") if row.skipped else
            (row.scenario, str(row.sent), str(row.failed), f"{row.longest:.1f}",
             seconds(row.detect), seconds(row.recover), str(row.wrongly_restarted),
             str(row.wrongly_lost), str(row.disagreeing))
            for row in rows
        ),
    )  # fmt: skip
    print()
    for row in rows:
        for why, times in row.reasons.items():
            print(f"{row.scenario}: {times} failed: {why}")
        for note in row.notes:
            print(f"{row.scenario}: {note}")
        for violation in row.violations:
            print(f"{row.scenario}: BROKEN: {violation}")


if __name__ == "__main__":
    sys.exit(main())
