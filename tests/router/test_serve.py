"""router/serve.py: N router processes on one port, each started again when it dies, all
stopped with their parent; and how many a machine gets by default."""

from __future__ import annotations

import os
import signal
import sys

import httpx
import psutil
import pytest

from router.serve import default_processes, processes_wanted
from tests.router.harness import Process, key_sha256
from tests.support.polling import wait_until
from tests.support.ports import free_port

KEY = "llmgw-test-serve-key"


@pytest.mark.parametrize(("cores", "processes"), [(1, 1), (2, 1), (4, 1), (8, 2), (16, 4),
                                                  (128, 4)])  # fmt: skip
def test_a_machine_gets_a_router_process_per_four_cores_at_most_four(cores, processes):
    assert default_processes(cores) == processes


def test_the_processes_knob_is_checked(monkeypatch):
    monkeypatch.setenv("LLMGW_ROUTER_PROCESSES", "3")
    assert processes_wanted() == 3
    monkeypatch.setenv("LLMGW_ROUTER_PROCESSES", "65")
    with pytest.raises(SystemExit, match="from 1 to 64"):
        processes_wanted()


def children(process: Process) -> list[psutil.Process]:
    return [c for c in psutil.Process(process.popen.pid).children() if c.is_running()]


def test_two_processes_serve_one_port_and_one_that_dies_is_started_again(harness):
    engine = harness.engine("A", "secret-a")
    static = harness.static_file(
        models=[{"name": "m", "endpoints": [{"url": engine.url, "secret": "secret-a"}]}],
        keys=[{"name": "k", "sha256": key_sha256(KEY)}],
    )
    port = free_port()
    served = Process(
        [sys.executable, "-m", "router.serve", "--port", str(port), "--processes", "2",
         "--log-level", "warning"],
        harness.root / "serve.log",
        {"LLMGW_ROUTER_STATIC": str(static),
         "LLMGW_ROUTER_TABLE_FILE": str(harness.root / "table.json")},
    )  # fmt: skip
    harness.processes.append(served)
    url = f"http://127.0.0.1:{port}"

    def answers() -> bool:
        assert served.alive(), served.output()
        try:
            reply = httpx.post(
                f"{url}/v1/chat/completions", headers={"Authorization": f"Bearer {KEY}"},
                json={"model": "m", "messages": [{"role": "user", "content": "hi"}]}, timeout=10,
            )  # fmt: skip
        except httpx.TransportError:
            return False
        return reply.status_code == 200

    wait_until(answers, what="the routers to answer")
    first = wait_until(lambda: len(children(served)) == 2 and children(served),
                       what="two router processes")  # fmt: skip
    os.kill(first[0].pid, signal.SIGKILL)
    # The other serves meanwhile; the dead one is replaced.
    assert answers()
    again = wait_until(
        lambda: (now := children(served)) and len(now) == 2 and first[0].pid not in
        {c.pid for c in now} and now, what="the killed router process started again",
    )  # fmt: skip
    for _request in range(10):
        assert answers()
    served.popen.send_signal(signal.SIGTERM)
    assert served.popen.wait(timeout=30) == 0
    assert not any(c.is_running() and c.status() != psutil.STATUS_ZOMBIE for c in again)
