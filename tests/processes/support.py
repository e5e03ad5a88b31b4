"""Starting and stopping the real processes of llmgw in tests, cleaning up after them, and
asking a router for an answer."""

from __future__ import annotations

import contextlib
import functools
import http.server
import json
import os
import signal
import socket
import subprocess
import sys
import tarfile
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
from django.conf import settings

from agent_worker.supervision.statedir import recorded_shards
from llmgw_cli.demo import DEMO_MODEL
from llmgw_cli.local_engine import local_engines, wheel_llama_server
from tests.support.polling import wait_until
from tests.support.ports import free_port

REPO = Path(__file__).resolve().parents[2]


def kill_engines_under(root: Path) -> list[int]:
    """Kill every engine the agents under ``root`` left running, as their state files record
    them (engines outlive their agent by design); return the process groups signalled."""
    killed = []
    for agent_dir in root.glob("**/agent"):
        for record in recorded_shards(agent_dir).values():
            for process in record.processes:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(process.pgid, signal.SIGKILL)
                    killed.append(process.pgid)
    return killed


def child_database_url() -> str:
    """The URL of the database pytest-django created, for child processes."""
    db = settings.DATABASES["default"]
    host = db.get("HOST") or ""
    port = f":{db['PORT']}" if db.get("PORT") else ""
    user = quote(db.get("USER") or "postgres")
    password = f":{quote(db['PASSWORD'])}" if db.get("PASSWORD") else ""
    if host.startswith("/"):
        return f"postgresql://{user}{password}@/{db['NAME']}?host={quote(host, safe='')}"
    return f"postgresql://{user}{password}@{host}{port}/{db['NAME']}"


class Process:
    """A child process in its own group, with its output in a log file."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log_dir: Path) -> None:
        self.name = name
        self.argv = argv
        self.env = env
        self.log_path = log_dir / f"{name}.log"
        self.popen: subprocess.Popen | None = None

    def start(self) -> Process:
        log = self.log_path.open("ab")
        self.popen = subprocess.Popen(
            self.argv, env=self.env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        return self

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    def signal(self, signum: int) -> None:
        if self.popen and self.popen.poll() is None:
            os.killpg(self.popen.pid, signum)

    def stop(self, timeout: float = 10) -> None:
        if not self.popen or self.popen.poll() is not None:
            return
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGTERM)
        try:
            self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            self.popen.wait()

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        if self.popen:
            self.popen.wait()

    def output(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def base_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        DATABASE_URL=child_database_url(),
        REDIS_URL=settings.REDIS_URL,
        DJANGO_SETTINGS_MODULE="llmgw_site.settings",
        PYTHONUNBUFFERED="1",
        # Most process tests link agents by token, the migration path; the certificate
        # link has tests of its own, and `llmgw up`'s tests use its local certificate.
        LLMGW_NODE_AUTH="token",
    )
    env.update(extra)
    return env


def control_plane(
    port: int, log_dir: Path, tls: tuple[Path, Path] | None = None, **extra: str
) -> Process:
    """Daphne serving the control plane; over TLS with ``tls`` (certificate, key)."""
    listen = ["-b", "127.0.0.1", "-p", str(port)]
    if tls is not None:
        cert, key = tls
        listen = ["-e", f"ssl:{port}:interface=127.0.0.1:privateKey={key}:certKey={cert}"]
    argv = [sys.executable, "-m", "daphne", *listen, "llmgw_site.asgi:application"]
    return Process(f"control-plane-{port}", argv, base_env(**extra), log_dir)


def agent(
    node_id: str, servers: str, token: str, home: Path, log_dir: Path, **extra: str
) -> Process:
    argv = [sys.executable, "-m", "celery", "-A", "agent_worker", "worker", "-Q",
            f"node-{node_id}", "-n", f"agent-{node_id}@%h", "--loglevel", "INFO"]  # fmt: skip
    defaults = {
        "LLMGW_AGENT_CONFIG": str(home / "no-agent-file.yaml"),
        "LLMGW_ENGINES": local_engines(),  # as `llmgw up` names the wheel
        "LLMGW_AGENT_BROKER": settings.REDIS_URL,
    }
    env = base_env(
        LLMGW_NODE_ID=node_id,
        LLMGW_AGENT_SERVERS=servers,
        LLMGW_AGENT_TOKEN=token,
        LLMGW_AGENT_DIR=str(home / "agent"),
        LLMGW_WEIGHTS_DIR=str(home / "weights"),
        LLMGW_HEARTBEAT_INTERVAL="1",
        **{**defaults, **extra},
    )
    env.pop("DJANGO_SETTINGS_MODULE")
    return Process(f"agent-{node_id}", argv, env, log_dir)


def reconciler(name: str, log_dir: Path, **extra: str) -> Process:
    """The control plane's Celery worker with beat: the reconciler and liveness."""
    argv = [sys.executable, "-m", "celery", "-A", "llmgw_cli", "worker", "-B", "-Q", "control",
            "--pool", "threads", "--concurrency", "2", "-n", f"{name}@%h", "--loglevel", "INFO",
            "--schedule", str(log_dir / f"{name}-beat-schedule")]  # fmt: skip
    return Process(name, argv, base_env(**extra), log_dir)


def listening(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def router(port: int, log_dir: Path, **extra: str) -> Process:
    argv = [sys.executable, "-m", "router.serve", "--host", "127.0.0.1", "--port", str(port),
            "--processes", "1"]  # fmt: skip
    return Process(f"router-{port}", argv, base_env(**extra), log_dir)


# A stand-in for llama-server and vllm: the agent file names it and the agent launches it with
# the adapter's real command line. Rank 0 also listens on --master-port (its rendezvous);
# a --headless worker serves nothing and only stays alive, as vLLM's do.
_FAKE_ENGINE = """#!{python}
import os, socket, sys, time

argv = sys.argv[1:]

def flag(name, default=""):
    return argv[argv.index(name) + 1] if name in argv else default

if "--headless" in argv:
    while True:
        time.sleep(1)
master = flag("--master-port")
if master:
    rendezvous = socket.socket()
    rendezvous.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    rendezvous.bind(("127.0.0.1", int(master)))
    rendezvous.listen()
    rendezvous.set_inheritable(True)  # kept across the exec below
stub = [{python!r}, {stub!r}, "--port", flag("--port"), "--api-key-file", flag("--api-key-file")]
os.execv(stub[0], stub)
"""


def fake_engines(directory: Path) -> str:
    """Fake ``llama-server`` and ``vllm``, as ``LLMGW_ENGINES`` naming them for an agent."""
    bin_dir = directory / "fake-bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    stub = REPO / "tests" / "agent" / "stub_engine.py"
    script = _FAKE_ENGINE.format(python=sys.executable, stub=str(stub))
    for name in ("llama-server", "vllm"):
        path = bin_dir / name
        path.write_text(script)
        path.chmod(0o755)
    return f"llama.cpp={bin_dir / 'llama-server'},vllm={bin_dir / 'vllm'}"


@dataclass
class OneNodeCluster:
    """A control plane, reconciler, router and one linked agent, started for a test."""

    node_id: str
    control_plane_url: str  # the agents' ws:// address
    router_url: str
    agent: Process  # the node's agent, as first started
    start_agent: Callable[[], Process]  # another agent for the same node (after a kill)
    base: str = ""  # the pages' address


def one_node_cluster(
    processes: list, tmp_path: Path, name: str, browser: bool = False
) -> OneNodeCluster:
    """Start the whole system on loopback with one agent, wait until it has linked; every
    process goes into ``processes`` to be stopped after the test. ``browser``: the pages
    know the router's address and the router answers their origin, as `llmgw up` sets."""
    from fleet.models import Node
    from fleet.pki.tokens import node_token
    from llmgw_cli.up import browser_settings

    node_id = f"{name}-{uuid.uuid4().hex[:6]}"
    lease = f"llmgw:test-leader:{uuid.uuid4().hex[:8]}"
    port, router_port = free_port(), free_port()
    url = f"ws://127.0.0.1:{port}"
    env = {"LLMGW_LEADER_LEASE_KEY": lease, "LLMGW_CONTROL_PLANE_ID": url,
           "LLMGW_ENGINE_PORT_BASE": str(free_port())}  # fmt: skip
    pages: dict[str, str] = {}
    if browser:
        browser_settings(pages, port, router_port)
    processes.append(control_plane(port, tmp_path, **env, **pages).start())
    processes.append(reconciler(f"reconciler-{name}", tmp_path, **env).start())
    processes.append(router(router_port, tmp_path, **pages).start())
    wait_until(lambda: listening(port), 60, "the control plane")

    def start_agent() -> Process:
        started = agent(node_id, url, node_token(node_id), tmp_path, tmp_path).start()
        processes.append(started)
        return started

    first = start_agent()
    wait_until(lambda: Node.objects.filter(id=node_id, state="connected").exists(), 60,
             "the agent to register")  # fmt: skip
    wait_until(lambda: listening(router_port), 60, "the router")
    return OneNodeCluster(
        node_id, url, f"http://127.0.0.1:{router_port}", first, start_agent,
        f"http://127.0.0.1:{port}",
    )  # fmt: skip


def chat(router_url: str, key: str, stream: bool = False, model: str = DEMO_MODEL):
    """Ask a router for a short answer: the response, or (streamed) the chunks it sent."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "Say hello in three words."}],
        "max_tokens": 16,
        "stream": stream,
    }
    headers = {"Authorization": f"Bearer {key}"}
    if not stream:
        return httpx.post(f"{router_url}/v1/chat/completions", json=body, headers=headers,
                          timeout=120)  # fmt: skip
    chunks = []
    with httpx.stream("POST", f"{router_url}/v1/chat/completions", json=body, headers=headers,
                      timeout=120) as response:  # fmt: skip
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line.removeprefix("data: ")))
    return chunks


def release_archive(directory: Path, version: str) -> Path:
    """A llama.cpp-style release: llama-server and its libraries in one top folder."""
    binary = wheel_llama_server()
    if binary is None:
        pytest.skip("the source-built llama-server is not installed (make engines builds it)")
    archive = directory / f"llama-{version}-bin-ubuntu-x64.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for path in sorted(Path(binary).parent.iterdir()):
            if path.name.startswith("llama-server") or path.name.startswith("lib"):
                tar.add(path, arcname=f"llama-{version}/bin/{path.name}", recursive=False)
    return archive


def serve(directory: Path) -> tuple[str, http.server.ThreadingHTTPServer]:
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}", server
