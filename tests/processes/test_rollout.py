"""A rolling restart under a streaming load, with the real control plane, reconciler, agent
and router, and stand-in engines that stream their answers.

The stand-in takes four seconds to stream each answer, longer than a reconcile pass, and
exits the moment it is told to stop, as an engine does: a replica stopped before its
streams were done would cut them, and the clients would see it. (The real llama-server
is too slow to start three times on a 2-core machine within the suite's budget;
test_end_to_end.py exercises it.)
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil
import pytest

from catalog.actions.api_keys import create_key
from catalog.actions.entries import apply_catalog
from fleet.models import Node, Replica
from fleet.pki.tokens import node_token
from fleet.routing_table import read_inflight_reports
from tests.factories import SETUP
from tests.fleet.queues import clear_queue
from tests.processes.support import (
    agent,
    control_plane,
    free_port,
    listening,
    reconciler,
    router,
    wait_until,
)

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

CHUNKS = 40
CHUNK_SECONDS = 0.1
CLIENTS = 4

# llama-server as far as the agent and the router can tell: /health, /v1/models, and a
# chat completion streamed in CHUNKS events, CHUNK_SECONDS apart.
_STREAMING_ENGINE = """#!{python}
import json, os, signal, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

argv = sys.argv[1:]

def flag(name, default=""):
    return argv[argv.index(name) + 1] if name in argv else default

KEY, MODEL = open(flag("--api-key-file")).read().strip(), flag("--alias", "stub")
signal.signal(signal.SIGTERM, lambda *_: os._exit(0))  # streams still running are cut


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        if self.path == "/health":
            self._json(200, {{"status": "ok"}})
        elif self.headers.get("Authorization") != f"Bearer {{KEY}}":
            self._json(401, {{"error": "wrong key"}})
        else:
            self._json(200, {{"object": "list", "data": [{{"id": MODEL}}]}})

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.headers.get("Authorization") != f"Bearer {{KEY}}":
            return self._json(401, {{"error": "wrong key"}})
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for i in range({chunks}):
            delta = {{"choices": [{{"index": 0, "delta": {{"content": f"w{{i}} "}}}}]}}
            self._event(json.dumps(delta))
            time.sleep({delay})
        self._event(json.dumps({{"choices": [], "usage": {{"prompt_tokens": 3,
                                 "completion_tokens": {chunks}}}}}))
        self._event("[DONE]")
        self.wfile.write(b"0\\r\\n\\r\\n")
        self.wfile.flush()

    def _event(self, data):
        body = f"data: {{data}}\\n\\n".encode()
        self.wfile.write(b"%x\\r\\n%s\\r\\n" % (len(body), body))
        self.wfile.flush()

    def _json(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


ThreadingHTTPServer((flag("--host", "127.0.0.1"), int(flag("--port"))), Handler).serve_forever()
"""


def streaming_engines(directory: Path) -> str:
    """``LLMGW_ENGINES`` naming the streaming stand-in as the agent's ``llama-server``."""
    bin_dir = directory / "streaming-bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    path = bin_dir / "llama-server"
    path.write_text(
        _STREAMING_ENGINE.format(python=sys.executable, chunks=CHUNKS, delay=CHUNK_SECONDS)
    )
    path.chmod(0o755)
    return f"llama.cpp={path}"


def catalog(source: Path, threads: int) -> str:
    return f"""
models:
  - name: tiny
    source: {source}
    profiles:
      - name: cpu
        engine: llama.cpp
        replicas: 2
        memory: 64MiB
        startup_timeout: 60
        drain_timeout: 20s
        args: ["--threads", "{threads}"]
"""


@dataclass
class Load:
    """Clients streaming completions through the router until told to stop."""

    url: str
    key: str
    stop: threading.Event = field(default_factory=threading.Event)
    done: list[tuple[float, float]] = field(default_factory=list)  # (started, ended)
    failed: list[str] = field(default_factory=list)
    threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> None:
        for _ in range(CLIENTS):
            thread = threading.Thread(target=self._client, daemon=True)
            thread.start()
            self.threads.append(thread)

    def finish(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=30)

    def _client(self) -> None:
        body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": True}
        headers = {"Authorization": f"Bearer {self.key}"}
        with httpx.Client(timeout=30) as client:
            while not self.stop.is_set():
                started = time.monotonic()
                try:
                    problem = self._one(client, body, headers)
                except Exception as exc:  # whatever breaks a request is a failed request
                    problem = f"{type(exc).__name__}: {exc}"
                if problem:
                    self.failed.append(problem)
                else:
                    self.done.append((started, time.monotonic()))

    def _one(self, client: httpx.Client, body: dict, headers: dict) -> str:
        words, finished = 0, False
        url = f"{self.url}/v1/chat/completions"
        with client.stream("POST", url, json=body, headers=headers) as response:
            if response.status_code != 200:
                return f"HTTP {response.status_code}: {response.read()[:200]!r}"
            for line in response.iter_lines():
                if line == "data: [DONE]":
                    finished = True
                elif line.startswith("data: "):
                    event = json.loads(line[6:])
                    if "error" in event:
                        return f"error event after {words} words: {event['error']}"
                    words += sum(1 for c in event["choices"] if c["delta"])
        if not finished or words != CHUNKS:
            return f"stream cut after {words} of {CHUNKS} words (finished: {finished})"
        return ""


def kill_engines(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)


def test_a_two_replica_profile_rolls_with_no_failed_request_under_a_streaming_load(
    processes, tmp_path
):
    node_id = f"ro-{uuid.uuid4().hex[:6]}"
    port, router_port = free_port(), free_port()
    env = {"LLMGW_LEADER_LEASE_KEY": f"llmgw:test-leader:{uuid.uuid4().hex[:8]}",
           "LLMGW_CONTROL_PLANE_ID": f"ws://127.0.0.1:{port}",
           "LLMGW_ENGINE_PORT_BASE": str(free_port()), "LLMGW_DEMO": "0"}  # fmt: skip
    processes.append(control_plane(port, tmp_path, **env).start())
    processes.append(reconciler("reconciler-rollout", tmp_path, **env).start())
    processes.append(router(router_port, tmp_path).start())
    wait_until(lambda: listening(port), 60, "the control plane")
    processes.append(
        agent(node_id, f"ws://127.0.0.1:{port}", node_token(node_id), tmp_path / node_id,
              tmp_path, LLMGW_ENGINES=streaming_engines(tmp_path)).start()
    )  # fmt: skip
    wait_until(lambda: Node.objects.filter(id=node_id, state="connected").exists(), 60,
             "the agent to register")  # fmt: skip

    model = tmp_path / "tiny.gguf"
    model.write_bytes(b"GGUF" + bytes(64))
    apply_catalog(catalog(model, threads=1), actor=SETUP)
    _row, key = create_key("rollout", actor=SETUP)
    engines: list[int] = []
    load = Load(f"http://127.0.0.1:{router_port}", key)
    try:
        wait_until(lambda: Replica.objects.filter(state="ready").count() == 2, 60,
                 "both replicas to be ready")  # fmt: skip
        old = {r.id: r.shards.get().pid for r in Replica.objects.filter(state="ready")}
        engines += old.values()
        wait_until(lambda: listening(router_port), 60, "the router")
        wait_until(lambda: httpx.get(f"{load.url}/health").json().get("routable_models"), 30,
                 "the router to route the model")  # fmt: skip
        load.start()
        wait_until(lambda: len(load.done) >= CLIENTS, 30, "the load to get going")

        applied = time.monotonic()
        apply_catalog(catalog(model, threads=2), actor=SETUP)
        reported: list[list] = []

        def rolled() -> bool:
            reports = read_inflight_reports() or []
            if reports:
                reported.append(reports)
            replicas = Replica.objects.filter(state__in=["starting", "ready"])
            return not set(old) & set(replicas.values_list("id", flat=True)) and (
                replicas.filter(state="ready").count() == 2
            )

        wait_until(rolled, 90, "the rollout to replace both replicas", interval=0.5)
        finished = time.monotonic()
        new = list(Replica.objects.filter(state="ready"))
        engines += [r.shards.get().pid for r in new]
        wait_until(lambda: sum(1 for _s, end in load.done if end > finished) >= CLIENTS, 30,
                 "requests after the rollout")  # fmt: skip
    finally:
        load.finish()
        clear_queue(node_id)
        kill_engines([pid for pid in engines if pid])

    assert load.failed == [], load.failed[:5]
    # The load ran through the whole rollout: answers began before it and ended after it.
    assert any(start < applied for start, _end in load.done)
    assert any(start > applied and end < finished for start, end in load.done)
    assert any(end > finished for _start, end in load.done)
    fingerprint = new[0].profile.fingerprint()
    assert {r.fingerprint for r in new} == {fingerprint}
    for replica_id, pid in old.items():
        stopped = Replica.objects.get(id=replica_id)
        assert stopped.state in ("stopping", "stopped") and stopped.fingerprint != fingerprint
        # Ended because the routers said they were done with it, not by the timeout.
        assert "drained: no router routes it" in stopped.reasons[0], stopped.reasons
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert reported, "the router never reported what it carries"
