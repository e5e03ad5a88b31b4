"""Database sessions a test leaves open, and closing the ones asgiref's thread keeps.

ORM calls from async code run in asgiref's one executor thread (``sync_to_async``, and
Channels' ``database_sync_to_async``, whose closing after each call does not reach the
connection the call opened under asgiref 3.13: the next call's closes it). So the last
such call of a test leaves a session open, and left open past the last test of a worker it
fails that worker's test database teardown ("being accessed by other users"), in whichever
worker happened to run such a test last. ``close_executor_connections`` closes it at the
end of each test; ``sessions_left`` finds any other a test leaves behind.
"""

from __future__ import annotations

import time

import psycopg
from asgiref.sync import SyncToAsync

# A session closed by its client leaves pg_stat_activity a moment later.
SETTLE_SECONDS = 1.0
_watcher: psycopg.Connection | None = None


def close_executor_connections() -> None:
    """Close the database connections asgiref's executor thread holds."""
    from django.db import connections

    SyncToAsync.single_thread_executor.submit(connections.close_all).result(timeout=10)


def other_sessions() -> dict[int, str]:
    """Pid -> last query of every session on the test database but this thread's own."""
    from django.db import connections

    settings = connections["default"].settings_dict
    mine = {c.connection.info.backend_pid for c in connections.all() if c.connection is not None}
    rows = (
        _watch()
        .execute(
            "SELECT pid, left(query, 160) FROM pg_stat_activity WHERE datname = %s",
            (settings["NAME"],),
        )
        .fetchall()
    )
    return {pid: query for pid, query in rows if pid not in mine}


def sessions_left(before: dict[int, str]) -> dict[int, str]:
    """The sessions opened since ``before`` that are still open once closing ones settle."""
    deadline = time.monotonic() + SETTLE_SECONDS
    while True:
        left = {pid: q for pid, q in other_sessions().items() if pid not in before}
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


def _watch() -> psycopg.Connection:
    """One session on the server's maintenance database for the whole run (a test
    database can be dropped with it open), opened again if it broke."""
    global _watcher
    if _watcher is None or _watcher.closed or _watcher.broken:
        from django.db import connections

        settings = connections["default"].settings_dict
        params = {"host": settings.get("HOST"), "port": settings.get("PORT"),
                  "user": settings.get("USER"), "password": settings.get("PASSWORD")}  # fmt: skip
        _watcher = psycopg.connect(
            dbname="postgres", autocommit=True, **{k: v for k, v in params.items() if v}
        )
    return _watcher
