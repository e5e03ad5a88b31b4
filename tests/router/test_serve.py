"""router/serve.py: N router processes on one port, each started again when it dies, all
stopped with their parent; and how many a machine gets by default."""

from __future__ import annotations

import os
import signal
import ssl
import sys

import httpx
import psutil
import pytest

from fleet.pki.authority import init_ca, issue_server_certificate
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


def test_a_stopped_router_finishes_the_stream_under_way_over_tls_and_takes_no_more(
    harness, tmp_path, settings
):
    """SIGTERM: the socket closes at once, the answer under way is finished, then it exits."""
    settings.LLMGW_CA_DIR = str(tmp_path / "ca")
    ca = init_ca()
    issued = issue_server_certificate(["127.0.0.1"])
    (tmp_path / "server.pem").write_bytes(issued.cert_pem)
    (tmp_path / "server-key.pem").write_bytes(issued.key_pem)
    engine = harness.engine("A", "secret-a")
    engine.control(gate=True, chunks=3)
    static = harness.static_file(
        models=[{"name": "m", "endpoints": [{"url": engine.url, "secret": "secret-a"}]}],
        keys=[{"name": "k", "sha256": key_sha256(KEY)}],
    )
    port = free_port()
    served = Process(
        [sys.executable, "-m", "router.serve", "--port", str(port), "--processes", "1",
         "--ssl-certfile", str(tmp_path / "server.pem"),
         "--ssl-keyfile", str(tmp_path / "server-key.pem")],
        harness.root / "serve.log", {"LLMGW_ROUTER_STATIC": str(static)},
    )  # fmt: skip
    harness.processes.append(served)
    url = f"https://127.0.0.1:{port}"
    verify = ssl.create_default_context(cafile=str(ca / "ca.pem"))

    def healthy() -> bool:
        assert served.alive(), served.output()
        try:
            return httpx.get(f"{url}/health", verify=verify, timeout=5).status_code == 200
        except httpx.TransportError:
            return False

    wait_until(healthy, what="the router to answer over TLS")
    with httpx.Client(verify=verify, timeout=30) as client, client.stream(
        "POST", f"{url}/v1/chat/completions", headers={"Authorization": f"Bearer {KEY}"},
        json={"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]},
    ) as stream:  # fmt: skip
        assert stream.status_code == 200
        lines = stream.iter_lines()
        assert next(line for line in lines if line.startswith("data:"))
        served.popen.send_signal(signal.SIGTERM)
        wait_until(lambda: "answers under way" in served.output(), what="the stop to begin")
        with pytest.raises(httpx.TransportError):  # the socket is closed to new clients
            httpx.get(f"{url}/health", verify=verify, timeout=5)
        for _chunk in range(3):
            engine.release()
        rest = list(lines)
    assert [line for line in rest if line][-1] == "data: [DONE]", rest
    assert served.popen.wait(timeout=30) == 0, served.output()
