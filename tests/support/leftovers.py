"""Nothing a test starts may outlive the test run.

Every process the run starts inherits a label in its environment, engines included (an
agent passes ``LLMGW_LABEL_*`` on to what it starts), so at the end the run can find what
it left behind even after its parent, its home and its state files are gone.
"""

from __future__ import annotations

import os
import time
import uuid

import psutil

LABEL = "LLMGW_LABEL_TEST_RUN"
GRACE_SECONDS = 5.0  # a process told to stop in the last teardown may still be exiting


def label_this_run() -> str:
    """Give this run (and so every child it starts) its label; return it. Each xdist
    worker is a run of its own: it must not take the other's processes for leftovers."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker:
        os.environ[LABEL] = f"{uuid.uuid4().hex}-{worker}"
    return os.environ.setdefault(LABEL, uuid.uuid4().hex)


def processes_left(label: str) -> list[psutil.Process]:
    """Every live process other than this one that carries ``label``."""
    found = []
    for process in psutil.process_iter():
        if process.pid == os.getpid():
            continue
        try:
            if process.status() == psutil.STATUS_ZOMBIE:
                continue
            if process.environ().get(LABEL) == label:
                found.append(process)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def stop_leftovers(label: str) -> list[str]:
    """Kill whatever the run left (after a short grace) and describe each one."""
    deadline = time.monotonic() + GRACE_SECONDS
    while (left := processes_left(label)) and time.monotonic() < deadline:
        time.sleep(0.2)
    described = []
    for process in left:
        try:
            described.append(f"pid {process.pid}: {' '.join(process.cmdline())[:300]}")
            process.kill()
        except psutil.Error:
            continue
    return described
