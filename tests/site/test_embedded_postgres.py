"""The embedded PostgreSQL asks for a password, and an older home's database gets one too.

Each test starts a real server (the pgserver wheel) in a home of its own and stops it.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import psycopg
import pytest

from llmgw_cli import embedded

pytestmark = pytest.mark.process


@pytest.fixture
def home():
    """Outside pytest's 0700 temp root, like tests/processes/test_up.py's."""
    root = Path(tempfile.mkdtemp(prefix="llmgw-pg-test-"))
    path = root / "home"
    yield path
    embedded.stop_postgres(path)
    embedded.started_here.discard(("postgres", path))
    shutil.rmtree(root, ignore_errors=True)


def socket_dir(url: str) -> str:
    return parse_qs(urlsplit(url).query)["host"][0]


def connect_without_password(url: str) -> psycopg.Connection:
    # No ~/.pgpass or PGPASSWORD may stand in for the password this is about.
    return psycopg.connect(
        host=socket_dir(url), user="postgres", dbname="llmgw", password="",
        passfile="/nonexistent/pgpass", connect_timeout=10,
    )  # fmt: skip


def assert_password_required(url: str) -> None:
    with pytest.raises(psycopg.OperationalError, match="password"):
        connect_without_password(url).close()
    with psycopg.connect(url, connect_timeout=10) as conn:
        assert conn.execute("SELECT current_user").fetchone() == ("postgres",)


def assert_home_private(home: Path) -> None:
    info = home.stat()
    if os.geteuid() == 0:
        # pgserver runs the server as its own user in root's group, which must search the
        # home to reach the data directory; no one else may.
        assert stat.S_IMODE(info.st_mode) == 0o710
        assert info.st_gid == os.getegid()
    else:
        assert stat.S_IMODE(info.st_mode) == 0o700
    assert stat.S_IMODE((home / "postgres-password").stat().st_mode) == 0o600


def test_the_embedded_postgres_refuses_connections_without_the_homes_password(home):
    url = embedded.postgres_url(home)
    password = (home / "postgres-password").read_text().strip()
    assert urlsplit(url).password == password
    assert_password_required(url)
    assert_home_private(home)
    # Stopped and started again (a later `llmgw up`): the same password, still required.
    embedded.stop_postgres(home)
    again = embedded.postgres_url(home)
    assert again == url
    assert_password_required(again)


def test_a_database_an_earlier_llmgw_made_with_trust_gets_the_password_and_keeps_its_data(
    home,
):
    import pgserver

    # What the earlier version did: pgserver's initdb (trust on the socket), then stopped.
    (home / "postgres").mkdir(parents=True)
    old = pgserver.get_server(home / "postgres", cleanup_mode=None)
    with psycopg.connect(old.get_uri("postgres"), autocommit=True) as conn:
        conn.execute("CREATE DATABASE llmgw")
    with psycopg.connect(old.get_uri("llmgw"), autocommit=True) as conn:
        conn.execute("CREATE TABLE kept (id int); INSERT INTO kept VALUES (7)")
    embedded.stop_postgres(home)

    url = embedded.postgres_url(home)
    assert_password_required(url)
    assert_home_private(home)
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT id FROM kept").fetchall() == [(7,)]


def test_two_commands_started_at_once_on_a_new_home_share_one_postgres(home):
    # `make run` in one terminal, `llmgw_ctl ...` in another while the first still runs
    # initdb (whose standalone backend writes its pid negated in postmaster.pid).
    code = (
        "import sys; from pathlib import Path; from llmgw_cli import embedded; "
        "print(embedded.postgres_url(Path(sys.argv[1])))"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    commands = [
        subprocess.Popen([sys.executable, "-c", code, str(home)], env=env, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for _ in range(3)
    ]  # fmt: skip
    outputs = [command.communicate(timeout=180) for command in commands]
    assert [command.returncode for command in commands] == [0, 0, 0], outputs
    urls = {out.strip() for out, _err in outputs}
    assert len(urls) == 1, outputs
    assert_password_required(urls.pop())
