"""Budgets that hold (issue 41, items 2 and 3): reservations settled to what answers used,
day and month totals kept by the ledger of record (the usage rows in PostgreSQL) through a
Redis killed and restarted, and each router's share of what is left while Redis is away.

Real parts: a private redis-server that is killed with SIGKILL and started again, the real
PostgreSQL the usage rows are written to, and the limiter and accounting as app.py wires
them in each router process.
"""

from __future__ import annotations

import time
import uuid

import pytest
import pytest_asyncio
import redis
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import connections

from bench.processes import RedisServer
from protocol.rate_limits import (
    INFLIGHT_HOLD_SECONDS,
    Limits,
    counter_keys,
    day_starts,
    month_starts,
)
from router.errors import RouterError
from router.intake import limits as limits_module
from router.intake.limits import RateLimiter
from router.metrics import RouterMetrics
from router.table.keys import Caller
from router.usage.accounting import Accounting, ledger_totals, write_usage

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]


def caller(**limits) -> Caller:
    prefix = f"llmgw-b{uuid.uuid4().hex[:7]}"
    return Caller(name="team-b", prefix=prefix, models=frozenset(), limits=Limits(**limits))


class RouterProcess:
    """One router's limiter and accounting, with the ledger as app.py gives it."""

    def __init__(self, redis_url: str) -> None:
        self.redis_url = redis_url
        self.accounting = Accounting()
        self.limiter = RateLimiter(lambda: self.redis_url, RouterMetrics(), ledger=self.ledger)

    async def ledger(self, prefix: str, now: float) -> tuple[int, int]:
        day_start, month_start = day_starts(now), month_starts(now)
        day, month = await sync_to_async(ledger_totals, thread_sensitive=True)(
            prefix, day_start, month_start
        )
        unwritten = self.accounting.unwritten(prefix, day_start, month_start)
        return day + unwritten[0], month + unwritten[1]

    async def serve(self, key: Caller, tokens: int, reserve: int = 0) -> None:
        """Admit a request, and settle it at ``tokens`` as the proxy does."""
        admission = await self.limiter.admit(key, reserve)
        self.accounting.record(key.prefix, key.name, "m", tokens // 2, tokens - tokens // 2)
        await self.limiter.charge(admission, tokens)

    async def flush(self) -> None:
        await self.accounting.flush(sync_to_async(write_usage, thread_sensitive=True))

    async def close(self) -> None:
        await self.limiter.close()


@pytest.fixture
def fast_retry(monkeypatch):
    """Routers try Redis again at once after it failed, rather than 5 s later."""
    monkeypatch.setattr(limits_module, "REDIS_RETRY_SECONDS", 0.0)


@pytest_asyncio.fixture
async def routers():
    made: list[RouterProcess] = []
    yield lambda url: made.append(RouterProcess(url)) or made[-1]
    for router in made:
        await router.close()
    await sync_to_async(connections.close_all)()  # the ledger's, before the test database goes


def day_counter(server: RedisServer, key: Caller) -> int | None:
    value = redis.Redis(port=server.port).get(counter_keys(key.prefix, time.time()).day)
    return None if value is None else int(value)


async def test_a_redis_restart_mid_day_leaves_every_budget_where_it_was(tmp_path, routers):
    """Redis killed without an append-only file loses every counter; the day's and month's
    come back from the usage rows, so the key is cut off where it would have been."""
    server = RedisServer(tmp_path / "redis", appendonly=False).start()
    try:
        a, b = routers(server.url), routers(server.url)
        key = caller(tokens_per_day=1000, tokens_per_month=5000)
        other = caller(tokens_per_day=300)
        await a.serve(key, 400)
        await b.serve(key, 200)
        await b.serve(other, 250)
        await a.flush()
        await b.flush()
        assert day_counter(server, key) == 600
        server.kill()
        server.start()
        assert day_counter(server, key) is None  # nothing kept: rebuilt from the ledger
        await a.serve(key, 300)
        assert day_counter(server, key) == 900
        await b.serve(key, 100)
        for router in (a, b):
            with pytest.raises(RouterError) as refused:
                await router.limiter.admit(key)
            assert refused.value.type == "insufficient_quota"
        await a.serve(other, 50)  # 250 from the ledger, and 50: the budget is spent
        with pytest.raises(RouterError):
            await b.limiter.admit(other)
    finally:
        server.kill()


async def test_an_append_only_redis_keeps_counters_not_yet_in_the_ledger(tmp_path, routers):
    server = RedisServer(tmp_path / "redis", appendonly=True).start()
    try:
        router = routers(server.url)
        key = caller(tokens_per_day=1000)
        await router.serve(key, 700)  # not flushed: only Redis has it
        time.sleep(1.5)  # appendfsync everysec
        server.kill()
        server.start()
        assert day_counter(server, key) == 700
    finally:
        server.kill()


async def test_while_redis_is_away_each_router_spends_its_share_of_what_is_left(
    tmp_path, routers, fast_retry
):
    server = RedisServer(tmp_path / "redis", appendonly=False).start()
    try:
        a, b = routers(server.url), routers(server.url)
        key = caller(tokens_per_day=1000)
        await a.serve(key, 300)
        await b.serve(key, 300)
        await a.flush()
        await b.flush()
        server.kill()
        # 400 left, two routers share the key: 200 each, not a fresh 1000.
        await a.serve(key, 150)
        await a.serve(key, 60)
        with pytest.raises(RouterError) as refused:
            await a.limiter.admit(key)
        assert refused.value.type == "insufficient_quota"
        assert a.limiter.metrics.limits_shared._value.get() == 0
        server.start()
        # Redis is back, empty: the total comes back from the ledger, with what a spent
        # alone (written or not), and b sees it.
        await a.serve(key, 10)
        assert day_counter(server, key) == 820
        await b.serve(key, 180)  # 1000: spent
        with pytest.raises(RouterError):
            await b.limiter.admit(key)
    finally:
        server.kill()


async def test_a_stalled_routers_local_charges_merge_back_when_redis_answers(routers, fast_retry):
    """Redis never went away, this router lost it for a while: what it spent meanwhile
    reaches the shared counter when it hears Redis again."""
    a, b = routers(settings.REDIS_URL), routers(settings.REDIS_URL)
    key = caller(tokens_per_day=10_000)
    await a.serve(key, 1000)
    await b.serve(key, 1000)
    a.redis_url = "redis://127.0.0.1:1/0"  # a's Redis stalls
    await a.limiter.close()
    await a.serve(key, 500)
    await a.flush()
    await b.flush()
    a.redis_url = settings.REDIS_URL
    await a.limiter.close()
    await a.serve(key, 100)
    client = redis.Redis.from_url(settings.REDIS_URL)
    assert int(client.get(counter_keys(key.prefix, time.time()).day)) == 2600


async def test_what_a_router_spent_alone_reaches_redis_before_the_ledger_has_it(
    routers, fast_retry
):
    """The rows lag a second: a router that hears Redis again adds what it spent alone to
    what Redis holds, rather than only raising it to a ledger that lacks what the other
    routers counted and have not written."""
    a, b = routers(settings.REDIS_URL), routers(settings.REDIS_URL)
    key = caller(tokens_per_day=2500)
    await a.serve(key, 1000)
    await b.serve(key, 500)  # in Redis, not yet in any row
    a.redis_url = "redis://127.0.0.1:1/0"  # a's Redis stalls
    await a.limiter.close()
    await a.serve(key, 600)  # counted alone
    a.redis_url = settings.REDIS_URL
    await a.limiter.close()
    await a.serve(key, 100)
    client = redis.Redis.from_url(settings.REDIS_URL)
    assert int(client.get(counter_keys(key.prefix, time.time()).day)) == 2200
    await b.serve(key, 300)  # 2500: spent, though no row was written
    with pytest.raises(RouterError) as refused:
        await b.limiter.admit(key)
    assert refused.value.type == "insufficient_quota"


async def test_a_request_settled_while_redis_was_away_gives_its_place_back(routers, fast_retry):
    """Admitted in Redis, answered while Redis did not answer: its place in flight and its
    reservation go when Redis answers again, not two minutes later."""
    a = routers(settings.REDIS_URL)
    key = caller(concurrency=1, tokens_per_day=1000)
    admission = await a.limiter.admit(key, 400)  # reserves 400 of the 1000
    a.redis_url = "redis://127.0.0.1:1/0"  # Redis stalls before the answer is settled
    await a.limiter.close()
    await a.limiter.charge(admission, 50)
    a.redis_url = settings.REDIS_URL
    await a.limiter.close()
    await a.serve(key, 10, reserve=900)  # neither the place nor the 400 are still held
    keys = counter_keys(key.prefix, time.time())
    client = redis.Redis.from_url(settings.REDIS_URL)
    assert client.zcard(keys.inflight) == 0 and not client.hgetall(keys.reserved)


# -- reservations (item 2) -----------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1_780_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest_asyncio.fixture(params=["redis", "local"])
async def limiter(request):
    url = settings.REDIS_URL if request.param == "redis" else ""
    made = RateLimiter(lambda: url, RouterMetrics(), clock=Clock())
    yield made
    await made.close()


async def test_admission_reserves_the_worst_case_and_settles_to_what_was_used(limiter):
    key = caller(tokens_per_day=1000)
    first = await limiter.admit(key, 400)
    second = await limiter.admit(key, 400)
    third = await limiter.admit(key, 400)  # 800 reserved < 1000: admitted, the last one
    with pytest.raises(RouterError) as refused:
        await limiter.admit(key, 400)  # 1200 reserved
    assert refused.value.type == "insufficient_quota"
    await limiter.charge(first, 100)  # settled: 100 used, 800 still reserved
    await limiter.charge(second, 50)
    fourth = await limiter.admit(key, 400)  # 150 used and 400 reserved: 550
    fifth = await limiter.admit(key, 100)  # 950
    with pytest.raises(RouterError):
        await limiter.admit(key, 10)  # 1050
    for admission in (third, fourth, fifth):
        await limiter.charge(admission, 0)
    assert await limiter.admit(key, 10) is not None  # 150 used


async def test_tokens_per_minute_count_reservations(limiter):
    key = caller(tokens_per_minute=500)
    held = await limiter.admit(key, 450)
    assert await limiter.admit(key, 50) is not None  # 450 < 500: admitted, 500 now
    with pytest.raises(RouterError) as refused:
        await limiter.admit(key, 40)
    assert refused.value.type == "rate_limit_exceeded"
    await limiter.charge(held, 5)
    assert await limiter.admit(key, 40) is not None


async def test_a_dead_routers_reservation_is_released_after_the_hold(limiter):
    key = caller(tokens_per_day=1000)
    await limiter.admit(key, 1000)  # its router dies: never settled
    with pytest.raises(RouterError):
        await limiter.admit(key, 10)
    limiter.clock.now += INFLIGHT_HOLD_SECONDS + 1
    assert await limiter.admit(key, 10) is not None


async def test_a_running_request_keeps_its_place_while_its_router_renews_it(limiter):
    key = caller(tokens_per_day=1000)
    running = await limiter.admit(key, 1000)
    for _ in range(5):  # ten minutes of a long stream, its hold renewed
        limiter.clock.now += INFLIGHT_HOLD_SECONDS / 2
        await limiter.renew_once()
        with pytest.raises(RouterError):
            await limiter.admit(key, 10)
    await limiter.charge(running, 20)
    assert await limiter.admit(key, 10) is not None
