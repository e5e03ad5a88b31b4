from __future__ import annotations

import fcntl
import tempfile
from pathlib import Path

import pytest

from tests.processes.scheduling import SIMULATED_FLEET_MODULES, longest_first
from tests.processes.support import Process, kill_engines_under


@pytest.fixture
def processes(tmp_path):
    """Start processes through this list; every one is stopped after the test."""
    started: list[Process] = []
    yield started
    for process in reversed(started):
        process.stop()
    # What the agents started outlives them on purpose; the test is over, so it goes too.
    kill_engines_under(tmp_path)
    for process in started:
        if process.popen and process.popen.returncode not in (0, None, -15, -9):
            print(
                f"--- {process.name} exited {process.popen.returncode}\n{process.output()[-3000:]}"
            )


# Each simulated-fleet test also holds this machine-wide lock while it runs: a bench or
# another checkout's suite may build a fleet on this machine too.
SIMULATED_FLEET_LOCK = Path(tempfile.gettempdir()) / "llmgw-simulated-fleet.lock"
# Seconds a simulated-fleet test may take, waiting for the lock included.
SIMULATED_FLEET_TIMEOUT = 1200


def pytest_collection_modifyitems(items):
    """The longest modules first, the partition run first of the simulated fleets (how
    they go out to the workers: tests/processes/scheduling.py)."""
    items.sort(key=_order)  # stable: the rest keep their order
    for item in items:
        if _module(item) in SIMULATED_FLEET_MODULES:
            item.add_marker(pytest.mark.timeout(SIMULATED_FLEET_TIMEOUT))


def _module(item) -> str:
    return item.module.__name__.rpartition(".")[2]


def _order(item) -> tuple[int, int]:
    module = _module(item)
    return longest_first(module), 0 if module == "test_partitions" else 1


@pytest.fixture(autouse=True)
def one_simulated_fleet_at_a_time(request):
    if _module(request) not in SIMULATED_FLEET_MODULES:
        yield
        return
    with open(SIMULATED_FLEET_LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or the worker dies
        yield
