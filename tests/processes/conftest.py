from __future__ import annotations

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
# `sim up` removes any it finds: with two xdist workers they must take turns.
SIMULATED_FLEET_MODULES = {"test_sim", "test_sim_impair", "test_partitions"}


def pytest_collection_modifyitems(items):
    """Under ``--dist loadgroup``: a module's tests stay together (as ``loadfile``), and
    every simulated-fleet test goes to one worker."""
    for item in items:
        module = item.module.__name__.rpartition(".")[2]
        group = "simulated-fleet" if module in SIMULATED_FLEET_MODULES else module
        item.add_marker(pytest.mark.xdist_group(group))
