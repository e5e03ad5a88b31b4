"""Per-key limits as routers count them: the Redis scripts against the real Redis, the
in-process counters that stand in while Redis is away, and the 429s they give.

The clock is injected: the scripts take the time from the router, so moving it moves
every window, in Redis as in memory.
"""

from __future__ import annotations

import uuid
from dataclasses import fields

import pytest
import pytest_asyncio
from django.conf import settings

from protocol.rate_limits import Limits, day_ends
from router.errors import RouterError
from router.intake.limited import reset_text
from router.intake.limits import RateLimiter
from router.metrics import RouterMetrics
from router.table.keys import Caller

pytestmark = pytest.mark.asyncio

NOON = 1_780_000_000.0  # some afternoon, UTC: far from midnight


class Clock:
    def __init__(self) -> None:
        self.now = NOON

    def __call__(self) -> float:
        return self.now


def caller(**limits) -> Caller:
    prefix = f"llmgw-t{uuid.uuid4().hex[:7]}"  # counters of one test never meet another's
    return Caller(name="team-a", prefix=prefix, models=frozenset(), limits=Limits(**limits))


@pytest_asyncio.fixture(params=["redis", "local"])
async def limiter(request):
    url = settings.REDIS_URL if request.param == "redis" else ""
    made = RateLimiter(lambda: url, RouterMetrics(), clock=Clock())
    yield made
    await made.close()


def headers(admission_or_error) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in admission_or_error.headers}


async def test_the_sixth_request_in_a_minute_is_refused_until_the_first_leaves_it(limiter):
    key = caller(requests_per_minute=5)
    remaining = []
    for _ in range(5):
        admission = await limiter.admit(key)
        remaining.append(headers(admission)["x-ratelimit-remaining-requests"])
        await limiter.charge(admission, 10)
        limiter.clock.now += 1
    assert remaining == ["4", "3", "2", "1", "0"]
    with pytest.raises(RouterError) as refused:
        await limiter.admit(key)
    error = refused.value
    assert error.status == 429 and error.type == "rate_limit_exceeded"
    assert "Key team-a reached its limit of 5 requests per minute" in error.message
    assert headers(error)["retry-after"] == "55"  # the first request leaves the minute then
    assert headers(error)["x-ratelimit-limit-requests"] == "5"
    limiter.clock.now += 55
    assert await limiter.admit(key) is not None


async def test_tokens_per_minute_count_what_answers_used(limiter):
    key = caller(tokens_per_minute=100)
    first = await limiter.admit(key)
    await limiter.charge(first, 60)
    limiter.clock.now += 10
    second = await limiter.admit(key)  # 60 of 100 used: still under
    assert headers(second)["x-ratelimit-remaining-tokens"] == "40"
    await limiter.charge(second, 50)
    with pytest.raises(RouterError) as refused:
        await limiter.admit(key)
    assert "its limit of 100 tokens per minute (110 used in the last minute)" in (
        refused.value.message
    )
    # The first answer's 60 tokens leave the minute 50 s later, and 50 < 100.
    assert headers(refused.value)["retry-after"] == "50"
    limiter.clock.now += 50
    assert await limiter.admit(key) is not None


async def test_a_daily_budget_is_insufficient_quota_until_midnight(limiter):
    key = caller(tokens_per_day=1000)
    await limiter.charge(await limiter.admit(key), 1000)
    with pytest.raises(RouterError) as refused:
        await limiter.admit(key)
    error = refused.value
    assert error.type == "insufficient_quota" and error.status == 429
    assert "budget of 1000 tokens for today (UTC)" in error.message
    assert "llmgw_ctl keys update" in error.message
    assert int(headers(error)["retry-after"]) == int(day_ends(NOON) - NOON)
    limiter.clock.now = day_ends(NOON) + 1
    assert await limiter.admit(key) is not None


async def test_a_concurrency_limit_holds_a_place_until_the_answer_is_charged(limiter):
    key = caller(concurrency=1)
    running = await limiter.admit(key)
    with pytest.raises(RouterError) as refused:
        await limiter.admit(key)
    assert "its limit of 1 requests in flight at once" in refused.value.message
    await limiter.charge(running, 5)
    assert await limiter.admit(key) is not None


async def test_a_key_without_limits_is_not_counted(limiter):
    assert await limiter.admit(caller()) is None


async def test_two_routers_hold_one_limit_together():
    clock = Clock()
    a, b = (RateLimiter(lambda: settings.REDIS_URL, RouterMetrics(), clock=clock) for _ in "ab")
    key = caller(requests_per_minute=4)
    for router in (a, b, a, b):
        await router.admit(key)
    for router in (a, b):
        with pytest.raises(RouterError):
            await router.admit(key)
    await a.close()
    await b.close()


async def test_without_redis_each_router_counts_alone_and_says_so():
    metrics = RouterMetrics()
    limiter = RateLimiter(lambda: "redis://127.0.0.1:1/0", metrics, clock=Clock())
    key = caller(requests_per_minute=2)
    await limiter.admit(key)
    assert metrics.limits_shared._value.get() == 0
    await limiter.admit(key)
    with pytest.raises(RouterError):
        await limiter.admit(key)
    assert b"llmgw_router_rate_limits_shared 0.0" in metrics.render()
    await limiter.close()


@pytest.mark.parametrize(
    ("ms", "text"), [(20, "20ms"), (1000, "1s"), (59_001, "1m0s"), (360_000, "6m0s")]
)
async def test_resets_are_written_as_openai_writes_them(ms, text):
    assert reset_text(ms) == text


@pytest.mark.parametrize("field", [f.name for f in fields(Limits)])
async def test_any_one_limit_set_makes_a_key_counted(field):
    assert Limits(**{field: 1}) and not Limits()
