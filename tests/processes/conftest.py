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
