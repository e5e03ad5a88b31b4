"""A bench's own database, and the Django that reads it.

Benches that measure the control plane run against the real PostgreSQL and Redis it
would run with (``DATABASE_URL``, ``REDIS_URL``), never embedded ones, and write their
fake fleet into a database of their own beside the named one, created once and migrated,
so it never lands in a real one.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit, urlunsplit

from bench.processes import REPO


def bench_database_url(url: str, database: str) -> str:
    """``url`` with its database replaced by ``database``."""
    return urlunsplit(urlsplit(url)._replace(path=f"/{database}"))


def prepare_database(server_url: str, env: dict[str, str]) -> float:
    """Create the database ``env``'s DATABASE_URL names on ``server_url``'s server if
    missing, and migrate it; return the seconds it took."""
    import psycopg

    database = urlsplit(env["DATABASE_URL"]).path.lstrip("/")
    began = time.perf_counter()
    with psycopg.connect(server_url, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [database]).fetchone()
        if not exists:
            conn.execute(f'CREATE DATABASE "{database}"')
    migrate = [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"]
    subprocess.run(migrate, cwd=REPO, env=env, check=True)
    return time.perf_counter() - began


@contextmanager
def bench_django(database: str, **extra: str) -> Iterator[dict[str, str]]:
    """Django set up in this process on the bench's own ``database`` (created and migrated
    first), the REDIS_URL given, a fresh SECRET_KEY and a fresh LLMGW_HOME, removed after.

    Yields the environment, for the servers the bench starts to run with the same; ``extra``
    adds to it (LOG_LEVEL is WARNING unless given)."""
    server_url, redis_url = os.environ.get("DATABASE_URL"), os.environ.get("REDIS_URL")
    if not server_url or not redis_url:
        raise SystemExit(
            "set DATABASE_URL and REDIS_URL: the bench measures the control plane against the "
            "real PostgreSQL and Redis it would run with (it creates and migrates its own "
            f"database {database!r} on that PostgreSQL server), not embedded ones"
        )
    env = {
        **os.environ,
        "DATABASE_URL": bench_database_url(server_url, database),
        "REDIS_URL": redis_url,
        "SECRET_KEY": secrets.token_urlsafe(32),
        "DJANGO_SETTINGS_MODULE": "llmgw_site.settings",
        "LLMGW_HOME": tempfile.mkdtemp(prefix="llmgw-bench-home-"),
        "LOG_LEVEL": os.environ.get("LOG_LEVEL", "WARNING"),
        **extra,
    }
    try:
        prepared = prepare_database(server_url, env)
        print(f"database {database} ready in {prepared:.1f} s", flush=True)
        os.environ.update(env)
        import django

        django.setup()
        yield env
    finally:
        shutil.rmtree(env["LLMGW_HOME"], ignore_errors=True)
