"""The processes and the database of bench/heartbeats.py: daphne, llmgw_bench, limits."""

from __future__ import annotations

import asyncio
import contextlib
import resource
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

REPO = Path(__file__).resolve().parent.parent
BENCH_DATABASE = "llmgw_bench"
NODE_PREFIX = "bench-node-"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def bench_database_url(url: str, database: str = BENCH_DATABASE) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{database}"))


def prepare_database(
    url: str, env: dict[str, str], database: str = BENCH_DATABASE, clear: bool = True
) -> float:
    """Create ``database`` (llmgw_bench) beside the given database if missing, migrate it
    (``env`` names it), clear old runs' rows unless told not to (a bench that clears its own)."""
    import psycopg

    began = time.perf_counter()
    with psycopg.connect(url, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [database]).fetchone()
        if not exists:
            conn.execute(f'CREATE DATABASE "{database}"')
    migrate = [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"]
    subprocess.run(migrate, cwd=REPO, env=env, check=True)
    if clear:
        clear_bench_rows(env["DATABASE_URL"])
    return time.perf_counter() - began


def clear_bench_rows(url: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DELETE FROM audit_event WHERE subject LIKE 'bench-%%'")
        conn.execute("DELETE FROM fleet_node WHERE id LIKE 'bench-%%'")


def fresh_rows(url: str, since: float) -> int:
    import psycopg

    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM fleet_node "
            "WHERE id LIKE %s AND usage_reported_at >= to_timestamp(%s)",
            [NODE_PREFIX + "%", since],
        ).fetchone()
    return row[0] if row else 0


def start_daphne(app: str, port: int, env: dict[str, str], log_path: Path) -> subprocess.Popen:
    argv = [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), app]
    with log_path.open("ab") as log:
        return subprocess.Popen(
            argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip


async def wait_listening(port: int, process: subprocess.Popen, log_path: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"daphne on {port} exited:\n{log_path.read_text()[-3000:]}")
        with contextlib.suppress(OSError):
            _reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            return
        await asyncio.sleep(0.1)
    raise SystemExit(f"daphne on {port} did not listen within 60 s")


def cpu_seconds(pid: int) -> float:
    import psutil

    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def raise_open_files(needed: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < needed:
        target = needed if hard == resource.RLIM_INFINITY else min(hard, needed)
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        if target < needed:
            raise SystemExit(
                f"need {needed} open files, the hard limit is {hard}; use fewer agents"
            )
