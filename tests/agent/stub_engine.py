#!/usr/bin/env python3
"""A stand-in engine for supervisor tests: serves /health like llama-server does.

    stub_engine.py --port P [--ready-after S] [--crash-after S] [--exit-code N]
                   [--ignore-sigterm] [--fork-child] [--print-lines N] [--hang]
                   [--api-key K | --api-key-file F]

/health answers 503 "Loading model" until --ready-after seconds have passed, then 200;
with --hang it accepts the connection and never answers, as a wedged engine does;
/v1/models names one model. With --api-key, requests without that bearer key get 401.
--fork-child forks a child that stays in the stub's process group and prints its pid
("child pid N"); with --child-session the child moves to a session of its own.
--tag is ignored: tests use it to find every process they started.

Run as a script it imports only the standard library, so it starts fast on a loaded
machine. Imported by tests, it also offers ``Harness``: supervisors and stub engines
for one test, and the cleanup that kills every process the test started.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

STUB = Path(__file__).resolve()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--ready-after", type=float, default=0.0)
    parser.add_argument("--crash-after", type=float, default=None)
    parser.add_argument("--exit-code", type=int, default=1)
    parser.add_argument("--ignore-sigterm", action="store_true")
    parser.add_argument("--fork-child", action="store_true")
    parser.add_argument("--child-session", action="store_true", help="the child calls setsid")
    parser.add_argument("--print-lines", type=int, default=0)
    parser.add_argument("--api-key", default="")
    parser.add_argument("--api-key-file", default="", help="the key, read from this file")
    parser.add_argument("--hang", action="store_true", help="/health never answers")
    parser.add_argument("--tag", default="")
    args = parser.parse_args(argv)
    if args.api_key_file:  # as llama-server's --api-key-file; vLLM's VLLM_API_KEY below
        with open(args.api_key_file) as key_file:
            args.api_key = key_file.read().strip()
    args.api_key = args.api_key or os.environ.get("VLLM_API_KEY", "")

    if args.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    started = time.monotonic()
    for i in range(args.print_lines):
        print(f"stub line {i}")
    print(f"stub engine pid {os.getpid()} on port {args.port}", flush=True)

    if args.fork_child:
        child = os.fork()
        if child == 0:
            if args.child_session:
                os.setsid()
            while True:  # the child keeps the parent's handlers and process group
                time.sleep(1)
        print(f"child pid {child}", flush=True)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            if args.api_key and self.headers.get("Authorization") != f"Bearer {args.api_key}":
                self._answer(401, {"error": "missing or wrong key"})
            elif self.path == "/health":
                if args.hang:
                    time.sleep(3600)
                elif time.monotonic() - started >= args.ready_after:
                    self._answer(200, {"status": "ok"})
                else:
                    self._answer(503, {"error": {"message": "Loading model"}})
            elif self.path == "/v1/models":
                self._answer(200, {"object": "list", "data": [{"id": "stub", "object": "model"}]})
            else:
                self._answer(404, {"error": "not found"})

        def _answer(self, status: int, body: object) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *rest: object) -> None:  # noqa: A002
            pass  # keep the log for what the tests print on purpose

    server = ThreadingHTTPServer((args.host, args.port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    if args.crash_after is not None:
        time.sleep(args.crash_after)
        print(f"stub crashing with exit code {args.exit_code}", flush=True)
        sys.stdout.flush()
        os._exit(args.exit_code)
    while True:
        time.sleep(3600)


# -- for tests ---------------------------------------------------------------------------
# Everything below imports lazily so the engine above starts on the standard library alone.

# Generous: a loaded 2-core machine can take seconds to start a Python process.
PATIENCE = 60.0


def gone(pid: int) -> bool:
    """Say whether ``pid`` no longer runs (an unreaped zombie counts as gone)."""
    import psutil

    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


class Harness:
    """Supervisors and stub engines of one test; ``cleanup`` kills all they started."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.tag = f"llmgw-test-{uuid.uuid4().hex}"
        self.transitions: list[Any] = []
        self.supervisors: list[Any] = []

    def supervisor(self, **options: Any) -> Any:
        """A supervisor on this test's state and log directories, with short intervals."""
        from agent_worker.supervisor import Supervisor

        fast = {
            "health_interval": 0.2,
            "poll_interval": 0.1,
            "settle": 1.0,
            "teardown_grace": 3.0,
        }
        sup = Supervisor(
            self.root / "state",
            self.root / "logs",
            self.transitions.append,
            **{**fast, **options},
        )
        self.supervisors.append(sup)
        return sup

    def command(self, port: int, *flags: str, name: str = "engine", **options: Any) -> Any:
        from agent_worker.engines.command import LaunchCommand

        argv = (sys.executable, str(STUB), "--port", str(port), "--tag", self.tag, *flags)
        return LaunchCommand(argv=argv, name=name, **options)

    def spec(self, shard_id: str = "shard-1", port: int | None = None, **fields: Any) -> Any:
        from protocol.shard import ShardSpec

        return ShardSpec(
            shard_id=shard_id,
            replica_id=f"replica-of-{shard_id}",
            model="stub",
            source="/models/stub.gguf",
            engine="llama.cpp",
            fingerprint="fp-1",
            port=port or _free_port(),
            **fields,
        )

    def states(self, shard_id: str) -> list[str]:
        return [t.state for t in list(self.transitions) if t.shard_id == shard_id]

    def wait_for(self, shard_id: str, state: str, timeout: float = PATIENCE) -> Any:
        """Return the first transition of ``shard_id`` into ``state``, waiting for it."""

        def seen() -> Any:
            matches = [t for t in list(self.transitions) if t.shard_id == shard_id]
            return next((t for t in matches if t.state == state), None)

        return _wait_until(seen, timeout, f"{shard_id} to become {state}: {self.transitions}")

    def tagged_pids(self) -> list[int]:
        import psutil

        found = []
        for proc in psutil.process_iter(["cmdline"]):
            if self.tag in (proc.info["cmdline"] or []):
                found.append(proc.pid)
        return found

    def cleanup(self) -> None:
        for sup in self.supervisors:
            sup.shutdown()
        for pid in self.tagged_pids():
            with contextlib.suppress(ProcessLookupError):
                pgid = os.getpgid(pid)
                if pgid == os.getpgrp():  # never the test run's own group
                    os.kill(pid, signal.SIGKILL)
                else:
                    os.killpg(pgid, signal.SIGKILL)
        _wait_until(lambda: all(gone(pid) for pid in self.tagged_pids()), 30, "stubs to die")


def _free_port() -> int:
    # Imported here, not at the top: run as a script, the stub imports the standard
    # library only (the tests package is not on its path).
    from tests.support.ports import free_port

    return free_port()


def _wait_until(condition, timeout: float, what: str) -> Any:
    from tests.support.polling import wait_until

    return wait_until(condition, timeout, what)


if __name__ == "__main__":
    main()
