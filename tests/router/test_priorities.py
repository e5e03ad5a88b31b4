"""Key priorities at a busy model: a real router on the real database and Redis, in
front of an engine that answers only when the test lets it.

The model's one replica serves one request at a time (a profile's concurrency of 1), so
the rest wait in the router: high first, and a full queue turns the lowest away.
"""

from __future__ import annotations

import threading

import httpx
import pytest
from django.conf import settings

from catalog.actions.api_keys import create_key
from fleet.models import ReplicaState, ShardState
from fleet.routing_table import read_inflight_reports
from tests.factories import SETUP, make_model, make_node, make_profile, make_replica, make_shard
from tests.processes.support import child_database_url
from tests.router.harness import wait_until

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def busy(harness):
    """One replica of concurrency 1 on a gated engine, a queue of two, and three keys."""
    engine = harness.engine("gated", "replica-secret", "--chunks", "2")
    engine.control(gate=True)
    replica = make_replica(make_profile(make_model("gemma"), replicas=1, concurrency=1),
                           state=ReplicaState.READY, secret="replica-secret")  # fmt: skip
    make_shard(replica, rank=0, node=make_node("node01", address="127.0.0.1"),
               port=engine.port, state=ShardState.READY)  # fmt: skip
    keys = {
        p: create_key(f"team-{p}", priority=p, actor=SETUP)[1] for p in ("high", "normal", "low")
    }
    router = harness.router({"DATABASE_URL": child_database_url(), "REDIS_URL": settings.REDIS_URL,
                             "LLMGW_ROUTER_QUEUE_SIZE": "2"})  # fmt: skip
    wait_until(lambda: httpx.get(f"{router.url}/health", timeout=10).json()["status"] == "ok",
               what="the router to load its table")  # fmt: skip
    return engine, router, keys


def queued() -> int:
    reports = read_inflight_reports() or []
    return sum(r["models"].get("gemma", {}).get("queued", 0) for r in reports)


class Asker:
    """Requests sent from threads, each named by what it asks."""

    def __init__(self, router) -> None:
        self.router = router
        self.answers: dict[str, httpx.Response] = {}
        self.threads: list[threading.Thread] = []

    def send(self, name: str, key: str) -> None:
        def run() -> None:
            self.answers[name] = httpx.post(
                f"{self.router.url}/v1/chat/completions", timeout=60,
                json={"model": "gemma", "messages": [{"role": "user", "content": name}]},
                headers={"Authorization": f"Bearer {key}"},
            )  # fmt: skip

        thread = threading.Thread(target=run)
        thread.start()
        self.threads.append(thread)


def asked(engine) -> list[str]:
    return [r["body"]["messages"][0]["content"] for r in engine.requests()
            if r["path"] == "/v1/chat/completions"]  # fmt: skip


def test_waiting_requests_are_served_high_first_and_a_full_queue_turns_the_lowest_away(busy):
    engine, router, keys = busy
    asker = Asker(router)
    asker.send("first", keys["normal"])
    wait_until(lambda: asked(engine) == ["first"], what="the first request to hold the place")
    asker.send("low-1", keys["low"])
    wait_until(lambda: queued() == 1, what="low-1 to wait")
    asker.send("normal-1", keys["normal"])
    wait_until(lambda: queued() == 2, what="normal-1 to wait")
    asker.send("high-1", keys["high"])
    wait_until(lambda: "low-1" in asker.answers, what="low-1 to be turned away")
    assert asker.answers["low-1"].status_code == 429
    assert "a request of higher priority took its place" in asker.answers["low-1"].text
    asker.send("low-2", keys["low"])
    wait_until(lambda: "low-2" in asker.answers, what="low-2 to be refused")
    assert asker.answers["low-2"].status_code == 429
    assert "all 2 places are taken" in asker.answers["low-2"].json()["error"]["message"]
    assert asker.answers["low-2"].headers["retry-after"] == "1"

    for served in (["first", "high-1"], ["first", "high-1", "normal-1"]):
        engine.release()
        wait_until(lambda s=served: asked(engine) == s, what=f"{served[-1]} to be let in")
    engine.release()
    for thread in asker.threads:
        thread.join(timeout=60)
    assert {n: a.status_code for n, a in asker.answers.items()} == {
        "first": 200, "low-1": 429, "normal-1": 200, "high-1": 200, "low-2": 429,
    }  # fmt: skip


def test_a_client_that_leaves_while_waiting_gives_up_its_place(busy):
    engine, router, keys = busy
    asker = Asker(router)
    asker.send("first", keys["normal"])
    wait_until(lambda: asked(engine) == ["first"], what="the first request to hold the place")
    body = {"model": "gemma", "messages": [{"role": "user", "content": "impatient"}]}
    patience = httpx.Timeout(10, read=2)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{router.url}/v1/chat/completions", json=body, timeout=patience,
                   headers={"Authorization": f"Bearer {keys['high']}"})  # fmt: skip
    wait_until(lambda: queued() == 0, what="the router to see the client gone")
    engine.release()
    for thread in asker.threads:
        thread.join(timeout=60)
    assert asker.answers["first"].status_code == 200
    engine.release()  # nothing waits for it: the impatient request never reaches the engine
    assert asked(engine) == ["first"]
