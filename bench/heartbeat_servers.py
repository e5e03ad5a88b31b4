"""The processes and the database rows of bench/heartbeats.py: daphne, the bench's
nodes, limits."""

from __future__ import annotations

import asyncio
import resource
import subprocess
import sys
import time
from pathlib import Path

from bench.processes import REPO

BENCH_DATABASE = "llmgw_bench"
NODE_PREFIX = "bench-node-"


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


def start_daphnes(
    app: str, count: int, env: dict[str, str], logs: Path, name: str
) -> tuple[int, list[subprocess.Popen], list[Path]]:
    """``count`` daphne processes on one listening socket, as `llmgw up` runs them:
    (port, the processes, their logs)."""
    from llmgw_cli.listener import daphne_command, listening_socket

    sock = listening_socket("127.0.0.1", 0)
    processes, log_paths = [], []
    try:
        argv = daphne_command(sys.executable, sock.fileno(), app)
        for index in range(count):
            log_paths.append(logs / f"{name}-{index + 1}.log")
            with log_paths[-1].open("ab") as log:
                processes.append(
                    subprocess.Popen(
                        argv,
                        cwd=REPO,
                        env=env,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                        pass_fds=(sock.fileno(),),
                    )  # fmt: skip
                )
        return sock.getsockname()[1], processes, log_paths
    finally:
        sock.close()  # the children hold it now


def links_per_process(processes: list[subprocess.Popen], port: int) -> list[int]:
    """How many established connections on ``port`` each process holds."""
    import psutil

    return [
        sum(
            1
            for c in psutil.Process(p.pid).net_connections("tcp")
            if c.laddr and c.laddr.port == port and c.status == psutil.CONN_ESTABLISHED
        )
        for p in processes
    ]


async def wait_serving(processes: list[subprocess.Popen], log_paths: list[Path]) -> None:
    """Until every process listens: the shared socket accepts before they all do, and the
    first one up would otherwise take every link."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for process, log_path in zip(processes, log_paths, strict=True):
            if process.poll() is not None:
                raise SystemExit(f"daphne exited:\n{log_path.read_text()[-3000:]}")
        if all("Listening on" in path.read_text(errors="replace") for path in log_paths):
            return
        await asyncio.sleep(0.1)
    raise SystemExit(f"daphne did not listen within 60 s: see {log_paths}")


def raise_open_files(needed: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < needed:
        target = needed if hard == resource.RLIM_INFINITY else min(hard, needed)
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        if target < needed:
            raise SystemExit(
                f"need {needed} open files, the hard limit is {hard}; use fewer agents"
            )
