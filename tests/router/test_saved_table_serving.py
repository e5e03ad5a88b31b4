"""The router keeps serving alone: started while the database is down, it serves the table
it saved last, only to engines that still answer, until the database answers again."""

from __future__ import annotations

import stat
import time
from urllib.parse import quote

import httpx
import pytest
from django.conf import settings

from catalog.actions.api_keys import create_key
from fleet.models import ReplicaState, ShardState
from router.table.saved import TableFile
from tests.factories import SETUP, make_model, make_node, make_profile, make_replica, make_shard
from tests.processes.support import child_database_url
from tests.router.harness import free_port, wait_until
from tests.support.metrics import metrics_auth

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

CHAT = {"messages": [{"role": "user", "content": "hello there"}]}


def ready_replica(model: str, engine, secret: str) -> None:
    replica = make_replica(make_profile(make_model(model), replicas=1), state=ReplicaState.READY,
                           secret=secret)  # fmt: skip
    make_shard(replica, rank=0, node=make_node(f"node-{model}", address="127.0.0.1"),
               port=engine.port, state=ShardState.READY)  # fmt: skip


def database_address() -> str | tuple[str, int]:
    """Where the test database listens: a unix socket path, or host and port."""
    db = settings.DATABASES["default"]
    host, port = db.get("HOST") or "127.0.0.1", int(db.get("PORT") or 5432)
    return f"{host}/.s.PGSQL.{port}" if host.startswith("/") else (host, port)


def database_url_on(port: int) -> str:
    """The test database's URL with its address replaced by 127.0.0.1:port."""
    db = settings.DATABASES["default"]
    password = f":{quote(db['PASSWORD'])}" if db.get("PASSWORD") else ""
    user = quote(db.get("USER") or "postgres")
    return f"postgresql://{user}{password}@127.0.0.1:{port}/{db['NAME']}"


def chat(router, key: str, model: str) -> httpx.Response:
    return httpx.post(f"{router.url}/v1/chat/completions", json={"model": model, **CHAT},
                      headers={"Authorization": f"Bearer {key}"}, timeout=30)  # fmt: skip


def health(router) -> httpx.Response:
    return httpx.get(f"{router.url}/health", timeout=30)


def metrics(router) -> str:
    return httpx.get(f"{router.url}/metrics", headers=metrics_auth(), timeout=30).text


def test_a_router_started_with_the_database_down_serves_from_its_saved_table(harness):
    kept = harness.engine("kept", "kept-secret")
    doomed = harness.engine("doomed", "doomed-secret")
    ready_replica("gemma", kept, "kept-secret")
    ready_replica("qwen", doomed, "doomed-secret")
    _row, key = create_key("team", actor=SETUP)
    table_file = harness.root / "saved" / "routing-table.json"
    env = {"REDIS_URL": settings.REDIS_URL, "LLMGW_ROUTER_TABLE_FILE": str(table_file)}

    first = harness.router({**env, "DATABASE_URL": child_database_url()})
    wait_until(table_file.exists, what="the router to save its table")
    assert chat(first, key, "gemma").status_code == 200
    assert stat.S_IMODE(table_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(table_file.parent.stat().st_mode) == 0o700
    assert "kept-secret" in table_file.read_text()  # why the file is private
    first.process.stop()
    doomed.process.stop()  # an engine that died while the database was away
    saved = TableFile(table_file).read()
    assert saved is not None

    port = free_port()  # nothing listens there yet: the database is down
    second = harness.router({**env, "DATABASE_URL": database_url_on(port)})
    before = time.time()
    answer = health(second)
    assert answer.status_code == 200
    body = answer.json()
    assert (body["status"], body["table_source"]) == ("degraded", "saved")
    # From the router's last load from the database, not from reading the file.
    assert body["table_age_seconds"] >= before - saved.loaded_at - 0.001
    assert "last_error" not in body  # to the metrics token's holder only (test_proxy.py)

    served = chat(second, key, "gemma")
    assert served.status_code == 200, served.text
    assert served.json()["system_fingerprint"] == "kept"
    assert kept.requests()[-1]["authorization"] == "Bearer kept-secret"
    assert chat(second, "llmgw-not-a-key", "gemma").status_code == 401  # the keys came too

    refused = chat(second, key, "qwen")
    assert refused.status_code == 503
    message = refused.json()["error"]["message"]
    assert "serving from its saved routing table" in message
    assert f"http://127.0.0.1:{doomed.port}" in message
    assert "did not answer its health check" in message
    scraped = metrics(second)
    assert "llmgw_router_table_from_saved 1.0" in scraped
    assert "llmgw_router_table_age_seconds " in scraped

    # The database comes back where the router looks for it: its table replaces the saved one.
    harness.forwarder(port, database_address())
    wait_until(lambda: health(second).json()["table_source"] == "database",
               what="the database's table to replace the saved one")  # fmt: skip
    assert health(second).json()["status"] == "ok"
    assert "llmgw_router_table_from_saved 0.0" in metrics(second)
    assert chat(second, key, "gemma").status_code == 200
