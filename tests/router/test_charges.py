"""What a key is charged: the prompt and every token relayed, however its answer ended
(issue 41, item 1), on a router reading the real database and counting in the real Redis."""

from __future__ import annotations

import json
import time

import httpx
import pytest
from django.conf import settings

from catalog.actions.api_keys import create_key
from catalog.keys import key_usage
from catalog.models import ApiKey
from fleet.models import ReplicaState, ShardState
from router.models import Usage
from tests.factories import SETUP, make_model, make_node, make_profile, make_replica, make_shard
from tests.processes.support import child_database_url
from tests.router.harness import wait_until

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

MESSAGES = [{"role": "user", "content": "hello there"}]
# The fake engine counts a prompt's words, as json.dumps writes its messages.
PROMPT_TOKENS = len(json.dumps(MESSAGES).split())


@pytest.fixture
def fleet(harness):
    """One ready replica on a fake engine, a key with a daily budget, a router over them."""
    engine = harness.engine("charge-engine", "replica-secret")
    replica = make_replica(make_profile(make_model("gemma"), replicas=1),
                           state=ReplicaState.READY, secret="replica-secret")  # fmt: skip
    make_shard(replica, rank=0, node=make_node("node01", address="127.0.0.1"),
               port=engine.port, state=ShardState.READY)  # fmt: skip
    _row, key = create_key("team", limits={"tokens_per_day": 100_000}, actor=SETUP)
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
    return engine, key, router


def usage_row(key: str, requests: int = 1) -> Usage | None:
    row = Usage.objects.filter(key_prefix=key[:14], model="gemma").first()
    return row if row is not None and row.requests >= requests else None


def day_counter(key: str) -> int:
    return key_usage(ApiKey.objects.get(prefix=key[:14]), time.time())["tokens_per_day"]


def test_a_client_that_closes_right_after_finish_reason_is_charged(fleet):
    """The engine's usage comes after the finish_reason; a client that has its answer and
    hangs up before it must still be charged the prompt and the three tokens it got."""
    engine, key, router = fleet
    engine.control(tail_delay=30)  # usage and [DONE] long after the finish_reason
    finished = False
    with httpx.stream(
        "POST", f"{router.url}/v1/chat/completions",
        json={"model": "gemma", "stream": True, "messages": MESSAGES},
        headers={"Authorization": f"Bearer {key}"}, timeout=30,
    ) as response:  # fmt: skip
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["finish_reason"]:
                finished = True
                break  # and hang up: the usage has not come yet
    assert finished
    row = wait_until(lambda: usage_row(key), what="the usage row of the stream cut short")
    assert (row.requests, row.prompt_tokens, row.completion_tokens) == (1, PROMPT_TOKENS, 3)
    wait_until(lambda: day_counter(key) == PROMPT_TOKENS + 3, what="the day's counter")
