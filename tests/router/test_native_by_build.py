"""Messages and Responses through a router reading the real database, to llama.cpp builds
older and newer than those APIs: the build decides whether the router translates
(protocol/serving.py's NATIVE_SINCE), not the engine's name."""

from __future__ import annotations

import httpx
import pytest
from django.conf import settings

from catalog.actions.api_keys import create_key
from fleet.models import ReplicaState, ShardState
from tests.factories import SETUP, make_model, make_node, make_profile, make_replica, make_shard
from tests.processes.support import child_database_url
from tests.router.harness import wait_until

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

ASKS = {
    "/v1/messages": {"max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]},
    "/v1/responses": {"input": "hi"},
}
LACKING = ["/v1/messages", "/v1/messages/count_tokens", "/v1/responses"]


@pytest.mark.parametrize("path", sorted(ASKS))
def test_an_old_llama_build_is_served_translated_and_a_new_one_natively(harness, path):
    old, new = harness.engine("b6000", "old-secret"), harness.engine("b8000", "new-secret")
    old.control(lacks=LACKING)  # as llama-server b6000 answers them: 404
    node = make_node("node01", address="127.0.0.1")
    for name, engine, version in (("old", old, "b6000"), ("new", new, "b8000")):
        replica = make_replica(make_profile(make_model(name)), state=ReplicaState.READY,
                               secret=f"{name}-secret", engine="llama.cpp",
                               engine_version=version)  # fmt: skip
        make_shard(replica, node=node, port=engine.port, state=ShardState.READY)
    _row, key = create_key("team", actor=SETUP)
    router = harness.router({"DATABASE_URL": child_database_url(), "REDIS_URL": settings.REDIS_URL,
                             "LLMGW_ROUTER_REFRESH_SECONDS": "3600"})  # fmt: skip
    wait_until(lambda: httpx.get(f"{router.url}/health", timeout=10).json()["status"] == "ok",
               what="the router to load its table")  # fmt: skip
    auth = {"Authorization": f"Bearer {key}"}

    for model, engine, reached in (("old", old, "/v1/chat/completions"), ("new", new, path)):
        answer = httpx.post(f"{router.url}{path}", json={"model": model, **ASKS[path]},
                            headers=auth, timeout=30)  # fmt: skip
        assert answer.status_code == 200, (model, answer.text)
        assert [r["path"] for r in engine.requests()] == [reached]
