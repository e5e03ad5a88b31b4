from __future__ import annotations

import fcntl
import tempfile
from pathlib import Path

import pytest

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


# Tests that build a simulated fleet share the machine's network namespaces (lsim-*), and
# `sim up` refuses while one runs (or with replace, takes it down): with two xdist workers
# they must take turns.
SIMULATED_FLEET_MODULES = {"test_sim", "test_sim_impair", "test_partitions", "test_walls"}


# The groups alone did not keep them apart (this xdist ran two sim modules side by side),
# so each simulated-fleet test also holds this machine-wide lock while it runs.
SIMULATED_FLEET_LOCK = Path(tempfile.gettempdir()) / "llmgw-simulated-fleet.lock"
# Seconds a simulated-fleet test may take, waiting for the lock included.
SIMULATED_FLEET_TIMEOUT = 1200


def pytest_collection_modifyitems(items):
    """Under ``--dist loadgroup``: a module's tests stay together (as ``loadfile``), and
    every simulated-fleet test goes to one worker.

    The longest (the partition run) goes out first and the other simulated fleets last, so
    the other worker runs everything else meanwhile rather than waiting for the lock.
    """
    items.sort(key=_simulated_fleet_order)  # stable: the rest keep their order
    for item in items:
        module = item.module.__name__.rpartition(".")[2]
        group = "simulated-fleet" if module in SIMULATED_FLEET_MODULES else module
        item.add_marker(pytest.mark.xdist_group(group))
        if module in SIMULATED_FLEET_MODULES:
            item.add_marker(pytest.mark.timeout(SIMULATED_FLEET_TIMEOUT))


def _simulated_fleet_order(item) -> int:
    module = item.module.__name__.rpartition(".")[2]
    if module == "test_partitions":
        return 0
    return 2 if module in SIMULATED_FLEET_MODULES else 1


@pytest.fixture(autouse=True)
def one_simulated_fleet_at_a_time(request):
    if request.module.__name__.rpartition(".")[2] not in SIMULATED_FLEET_MODULES:
        yield
        return
    with open(SIMULATED_FLEET_LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or the worker dies
        yield
