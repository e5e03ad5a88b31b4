"""The router holds no fleet secret: it starts without SECRET_KEY (its own settings module
reads none, and makes no key file), and reads the database as a role that may read the
tables it routes from and add to its usage table, nothing more."""

from __future__ import annotations

import httpx
import psycopg
import pytest
from django.conf import settings
from django.db import connection

from catalog.actions.api_keys import create_key
from fleet.models import ReplicaState, ShardState
from router.database_role import drop_router_role, grant_router_role, role_url
from tests.factories import SETUP, make_model, make_node, make_profile, make_replica, make_shard
from tests.processes.support import child_database_url
from tests.router.harness import wait_until

pytestmark = [pytest.mark.django_db(transaction=True)]

PASSWORD = "router-test-password"  # noqa: S105 (a test role's, dropped after)


@pytest.fixture
def router_url():
    """The test database's URL as the router's role, made for the test and dropped after."""
    role = grant_router_role(connection, PASSWORD)
    yield role_url(child_database_url(), role, PASSWORD)
    drop_router_role(connection, role)


def test_the_routers_role_cannot_change_the_catalog(router_url):
    profile = make_profile(make_model("gemma"))
    with psycopg.connect(router_url, autocommit=True) as conn:
        assert conn.execute("SELECT name FROM catalog_profile").fetchall() == [("cpu",)]
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="catalog_profile"):
            conn.execute("UPDATE catalog_profile SET replicas = 9")
        for statement in ("DELETE FROM catalog_apikey", "UPDATE fleet_replica SET secret = ''",
                          "INSERT INTO auth_user (username) VALUES ('x')",
                          "SELECT * FROM auth_user"):  # fmt: skip
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(statement)
        conn.execute(
            "INSERT INTO router_usage (hour, key_prefix, key_name, model, requests, "
            "prompt_tokens, completion_tokens) VALUES (now(), '', '', 'gemma', 1, 2, 3)"
        )
    profile.refresh_from_db()
    assert profile.replicas != 9


@pytest.mark.process
def test_the_router_starts_without_secret_key_and_makes_no_key_file(harness, router_url, tmp_path):
    engine = harness.engine("db-engine", "replica-secret")
    replica = make_replica(make_profile(make_model("gemma")), state=ReplicaState.READY,
                           secret="replica-secret")  # fmt: skip
    make_shard(replica, node=make_node("node01", address="127.0.0.1"), port=engine.port,
               state=ShardState.READY)  # fmt: skip
    _row, key = create_key("team", actor=SETUP)
    home = tmp_path / "router-home"
    router = harness.router({
        "DATABASE_URL": router_url, "REDIS_URL": settings.REDIS_URL, "SECRET_KEY": "",
        "LLMGW_FLEET_KEY": "", "LLMGW_HOME": str(home),
        # What `llmgw up` and the tests give every process: the router uses its own.
        "DJANGO_SETTINGS_MODULE": "llmgw_site.settings",
        "LLMGW_ROUTER_ACCOUNTING_SECONDS": "0.2",
    })  # fmt: skip
    answer = wait_until(lambda: httpx.post(
        f"{router.url}/v1/chat/completions", headers={"Authorization": f"Bearer {key}"},
        json={"model": "gemma", "messages": [{"role": "user", "content": "hi"}]}, timeout=10,
    ).status_code == 200, what="the router to serve from the database")  # fmt: skip
    assert answer
    from router.models import Usage

    wait_until(Usage.objects.exists, what="the router's usage row")
    assert not (home / "secret_key").exists() and not (home / "fleet_key").exists()
    assert "SECRET_KEY" not in router.process.output()
