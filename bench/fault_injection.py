"""The faults bench/faults.py injects: kills, a stopped agent, a paused leader."""

from __future__ import annotations

import os
import signal
import time

import psutil

from bench.fault_system import System, retry
from bench.processes import wait_for

PROCESS_FAULTS = ["agent", "control-plane", "reconciler", "router", "redis", "postgres"]
# The engine last: it is killed only once it has served past the reconciler's settling
# time, which the faults before it have used up by then instead of a wait.
FAULTS = [*PROCESS_FAULTS, "agent-stop", "failover", "engine"]


def _started(pid: int) -> float:
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return 0.0


def inject(system: System, fault: str, stop_seconds: float) -> tuple[float, str | None]:
    """Do the fault; return (when recovery is measured from, the shard killed on purpose)."""
    if fault in PROCESS_FAULTS:
        before = system.children()[fault]
        os.kill(int(before), signal.SIGKILL)
        wait_for(lambda: system.children().get(fault) not in (None, before), 120,
                 f"{fault} to be restarted")  # fmt: skip
        return time.monotonic(), None
    if fault == "engine":
        # The engine that has served longest: one that died a moment after it started would
        # be a crash loop, which the reconciler rightly answers with a growing backoff.
        shard_id, pid = min(system.engines().items(), key=lambda item: _started(item[1]))
        # A healthy engine that dies: one that has served past the reconciler's settling
        # time (its death does not grow the profile's replacement backoff).
        from fleet.planning.backoff import SETTLED

        time.sleep(max(0.0, _started(pid) + SETTLED.total_seconds() + 5 - time.time()))
        os.kill(pid, signal.SIGKILL)
        return time.monotonic(), shard_id
    if fault == "agent-stop":
        pid = int(system.children()["agent"])
        os.kill(pid, signal.SIGSTOP)
        time.sleep(stop_seconds)
        os.kill(pid, signal.SIGCONT)
        return time.monotonic(), None
    if fault == "failover":
        from fleet import leadership

        pid = system.leading_reconciler()
        before = retry(leadership.current)
        os.killpg(os.getpgid(pid), signal.SIGSTOP)

        def standby_leads() -> bool:
            lease = retry(leadership.current)
            return lease is not None and before is not None and lease.epoch > before.epoch

        try:
            wait_for(standby_leads, 60, "the standby to lead")
        finally:
            os.killpg(os.getpgid(pid), signal.SIGCONT)
        return time.monotonic(), None
    raise ValueError(f"unknown fault {fault!r}; choose from {', '.join(FAULTS)}")
