"""The limit scripts asked for together go to Redis together (router/intake/script_batch.py),
against a real Redis: each caller gets its own script's answer, a script Redis lost is
loaded again, and a Redis that does not answer fails every run of the batch."""

from __future__ import annotations

import asyncio
import os
import uuid

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError

from router.intake.script_batch import ScriptBatch
from tests.support.ports import free_port

ECHO = "return {KEYS[1], ARGV[1]}"
INCREMENT = "return redis.call('INCRBY', KEYS[1], ARGV[1])"


class CountingBatch(ScriptBatch):
    """Counts the pipelines it sends: what batching saves."""

    pipelines = 0

    async def _pipeline(self, runs):
        self.pipelines += 1
        return await super()._pipeline(runs)


def redis_url() -> str:
    url = os.environ.get("REDIS_URL")
    if not url:
        pytest.skip("REDIS_URL names no Redis")
    return url


def test_runs_asked_for_together_share_one_pipeline_and_each_gets_its_answer():
    async def scene() -> None:
        client = aioredis.Redis.from_url(redis_url())
        batch = CountingBatch(client)
        for script in (ECHO, INCREMENT):  # loaded: one pipeline a batch, none to load them
            await client.script_load(script)
        try:
            answers = await asyncio.gather(
                *(batch.run(ECHO, [f"llmgw-test-batch-{n}"], [n]) for n in range(50))
            )
            assert [[k.decode(), int(v)] for k, v in answers] == [
                [f"llmgw-test-batch-{n}", n] for n in range(50)
            ]
            assert batch.pipelines == 1

            # One that may wait goes with the next that may not, ahead of it.
            await client.delete("llmgw-test-batch-count")
            waiting = asyncio.ensure_future(
                batch.run(INCREMENT, ["llmgw-test-batch-count"], [2], wait=60)
            )
            await asyncio.sleep(0)
            now = await batch.run(INCREMENT, ["llmgw-test-batch-count"], [3])
            assert now == 5 and await waiting == 2
            assert batch.pipelines == 2
        finally:
            await client.delete("llmgw-test-batch-count")
            await batch.close()
            await client.aclose()

    asyncio.run(scene())


def test_a_script_redis_does_not_hold_is_loaded_and_run():
    # A script of its own (SCRIPT FLUSH would empty a shared Redis of others' scripts too):
    # to Redis as new as it is after a restart.
    fresh = f"{ECHO} -- {uuid.uuid4().hex}"

    async def scene() -> None:
        client = aioredis.Redis.from_url(redis_url())
        batch = ScriptBatch(client)
        try:
            first, second = await asyncio.gather(batch.run(fresh, ["k"], ["first"]),
                                                 batch.run(fresh, ["k"], ["second"]))  # fmt: skip
            assert (first, second) == ([b"k", b"first"], [b"k", b"second"])
            assert await batch.run(fresh, ["k"], ["again"]) == [b"k", b"again"]
        finally:
            await batch.close()
            await client.aclose()

    asyncio.run(scene())


def test_a_redis_that_does_not_answer_fails_every_run_of_the_batch():
    async def scene() -> None:
        client = aioredis.Redis(port=free_port(), socket_connect_timeout=0.5)
        batch = ScriptBatch(client)
        try:
            outcomes = await asyncio.gather(
                *(batch.run(ECHO, ["k"], [n]) for n in range(3)), return_exceptions=True
            )
            assert all(isinstance(o, RedisConnectionError) for o in outcomes), outcomes
        finally:
            await batch.close()
            await client.aclose()

    asyncio.run(scene())
