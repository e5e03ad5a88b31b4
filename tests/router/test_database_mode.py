"""A router reading the real database and listening on the real Redis.

The periodic refresh is set to an hour, so every change a test sees arrived through the
pub/sub notification, not the safety net.
"""

from __future__ import annotations

from datetime import timedelta

import httpx
import pytest
import time_machine
from django.conf import settings
from django.utils import timezone

from audit.models import Event
from catalog.actions.api_keys import create_key, revoke_key
from catalog.models import ApiKey
from fleet import traffic
from fleet.models import Replica, ReplicaState, ShardState
from fleet.transitions import transition
from protocol.routing import TRAFFIC_BUCKET_SECONDS
from router.models import Usage
from tests.factories import (
    SETUP,
    api_token_of,
    make_model,
    make_node,
    make_profile,
    make_replica,
    make_shard,
    make_user,
)
from tests.processes.support import child_database_url, control_plane, free_port, listening
from tests.router.harness import wait_until

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

CHAT = {"messages": [{"role": "user", "content": "hello there"}]}


@pytest.fixture
def fleet(harness):
    """A catalog model whose one replica is starting on an engine that is already up."""
    engine = harness.engine("db-engine", "replica-secret")
    model = make_model("gemma", aliases=["g"])
    replica = make_replica(make_profile(model, replicas=1), state=ReplicaState.STARTING,
                           secret="replica-secret")  # fmt: skip
    make_shard(replica, rank=0, node=make_node("node01", address="127.0.0.1"),
               port=engine.port, state=ShardState.READY)  # fmt: skip
    make_profile(make_model("idle"), replicas=0)
    _row, key = create_key("team", actor=SETUP)
    router = harness.router(
        {
            "DATABASE_URL": child_database_url(),
            "REDIS_URL": settings.REDIS_URL,
            "LLMGW_ROUTER_REFRESH_SECONDS": "3600",
            "LLMGW_ROUTER_ACCOUNTING_SECONDS": "0.2",
        }
    )
    wait_until(lambda: httpx.get(f"{router.url}/health", timeout=10).json()["status"] == "ok",
               what="the router to load its table")  # fmt: skip
    return engine, replica, key, router


def chat(router, key: str, model: str = "g") -> httpx.Response:
    return httpx.post(
        f"{router.url}/v1/chat/completions",
        json={"model": model, **CHAT},
        headers={"Authorization": f"Bearer {key}"},
        timeout=30,
    )


def test_a_replica_becoming_ready_or_going_away_reroutes_within_moments(fleet):
    engine, replica, key, router = fleet
    starting = chat(router, key)
    assert starting.status_code == 503
    assert starting.headers["retry-after"] == "5"
    assert "No ready replica of gemma: 1 starting" in starting.json()["error"]["message"]

    transition(Replica, replica.pk, ReplicaState.READY, "rank 0 answers", actor=SETUP)
    answered = wait_until(lambda: chat(router, key).status_code == 200, what="routing to it")
    assert answered
    (seen,) = [r for r in engine.requests() if r["path"] == "/v1/chat/completions"]
    assert seen["model"] == "gemma"
    assert seen["authorization"] == "Bearer replica-secret"
    models = httpx.get(f"{router.url}/v1/models", headers={"Authorization": f"Bearer {key}"},
                       timeout=10).json()  # fmt: skip
    assert [(m["id"], m["llmgw"]["replicas"]) for m in models["data"]] == [
        ("gemma", {"wanted": 1, "ready": 1})
    ]

    transition(Replica, replica.pk, ReplicaState.STOPPING, "scaled down", actor=SETUP)
    wait_until(lambda: chat(router, key).status_code == 503, what="the replica to leave")
    assert "1 stopping" in chat(router, key).json()["error"]["message"]


def test_a_model_nobody_wants_is_503_saying_so(fleet):
    _engine, _replica, key, router = fleet
    response = chat(router, key, "idle")
    assert response.status_code == 503
    assert "none wanted" in response.json()["error"]["message"]
    assert response.headers["retry-after"] == "60"


def test_revoking_a_key_refuses_it_and_a_new_key_works_without_a_restart(fleet):
    _engine, _replica, key, router = fleet
    assert chat(router, key, "idle").status_code == 503  # accepted, just nothing to run
    revoke_key(key, actor=SETUP)
    wait_until(lambda: chat(router, key, "idle").status_code == 401, what="the revoke")
    _row, fresh = create_key("team-2", ["idle"], actor=SETUP)
    wait_until(lambda: chat(router, fresh, "idle").status_code == 503, what="the new key")
    assert chat(router, fresh, "gemma").status_code == 403


def test_a_key_expired_over_an_hour_leaves_the_router_on_the_next_table_push(fleet):
    _engine, replica, _key, router = fleet
    now = timezone.now()
    with time_machine.travel(now - timedelta(hours=3)):  # made when it had time left
        _row, key = create_key("gone", expires_at=now - timedelta(minutes=30), actor=SETUP)
    # Expired within the hour: the router holds it, to say that it expired.
    wait_until(lambda: chat(router, key, "idle").json()["error"]["code"] == "expired_api_key",
               what="the router to load the key")  # fmt: skip
    # An hour on (time passing pushes nothing), it still holds it...
    ApiKey.objects.filter(prefix=key[:14]).update(expires_at=now - timedelta(hours=2))
    assert chat(router, key, "idle").json()["error"]["code"] == "expired_api_key"
    # ...until the next push of any kind, which reloads the key set whole, without it.
    transition(Replica, replica.pk, ReplicaState.READY, "rank 0 answers", actor=SETUP)
    wait_until(lambda: chat(router, key, "idle").json()["error"]["code"] == "invalid_api_key",
               timeout=2.0, what="the expired key to leave the router")  # fmt: skip


def test_usage_is_written_per_key_and_model_in_batches(fleet):
    _engine, replica, key, router = fleet
    transition(Replica, replica.pk, ReplicaState.READY, "rank 0 answers", actor=SETUP)
    wait_until(lambda: chat(router, key).status_code == 200, what="routing to it")
    stream = httpx.post(
        f"{router.url}/v1/chat/completions", json={"model": "gemma", "stream": True, **CHAT},
        headers={"Authorization": f"Bearer {key}"}, timeout=30,
    )  # fmt: skip
    assert stream.status_code == 200

    def written() -> Usage | None:
        row = Usage.objects.filter(key_prefix=key[:14], model="gemma").first()
        return row if row is not None and row.requests >= 2 else None

    row = wait_until(written, what="usage rows")
    assert row.key_name == "team"
    assert row.completion_tokens == 3 * row.requests  # the fake engine's 3 chunks each
    assert row.prompt_tokens > 0


def test_a_model_created_through_the_rest_api_is_recorded_and_reaches_the_router(fleet, tmp_path):
    """The API writes through the catalog's verb: an Event naming the operator, and a
    notice that reaches a running router at once (its periodic refresh is an hour away)."""
    _engine, _replica, key, router = fleet
    operator = make_user("olga", operator=True)
    token = api_token_of(operator)
    port = free_port()
    (tmp_path / "logs").mkdir()
    control = control_plane(port, tmp_path / "logs").start()
    try:
        wait_until(lambda: listening(port), what="the control plane to listen")
        assert chat(router, key, "mistral").status_code == 404  # not in the catalog yet
        response = httpx.post(
            f"http://127.0.0.1:{port}/api/v1/models/",
            json={"name": "mistral", "source": "/m/mistral.gguf"},
            headers={"Authorization": f"Token {token}"},
            timeout=30,
        )
        assert response.status_code == 201, response.text
        # Known to the router now, with nothing wanted yet: 503, no longer 404.
        wait_until(
            lambda: chat(router, key, "mistral").status_code == 503,
            timeout=2.0,
            what="the router to learn of the new model",
        )
    finally:
        control.stop()
    event = Event.objects.get(subject="model/mistral")
    assert event.kind == "catalog" and event.reason == "created model mistral"
    assert event.actor == operator and event.description == "created model mistral by olga"


def test_what_the_router_served_reaches_the_model_pages_traffic(fleet):
    _engine, replica, key, router = fleet

    def served() -> int:
        charts = {c["id"]: c for c in traffic.model_traffic("gemma")["charts"]}
        values = charts["requests"]["series"][0]["values"] if charts["requests"]["x"] else []
        return round(sum(values) * TRAFFIC_BUCKET_SECONDS)

    before = served()
    transition(Replica, replica.pk, ReplicaState.READY, "rank 0 answers", actor=SETUP)
    wait_until(lambda: chat(router, key).status_code == 200, what="routing to it")
    for _ in range(3):
        assert chat(router, key).status_code == 200
    # Reported within a second or two, each request counted once (503s while it started too).
    wait_until(lambda: served() >= before + 4, what="the router's traffic report")
