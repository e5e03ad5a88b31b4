"""A team's budgets as routers count them: the same Redis scripts as a key's, held for all
the team's keys together, the more restrictive of key and team refusing and the refusal
naming whose limit it was; and what a key's team may see of the catalog.

The clock is injected, as in test_limits.py.
"""

from __future__ import annotations

import uuid

import pytest
import pytest_asyncio
from django.conf import settings

from protocol.rate_limits import Limits, counter_keys, team_counter_name
from router.errors import RouterError
from router.intake.limits import RateLimiter
from router.metrics import RouterMetrics
from router.table.keys import Caller, KeyCache

pytestmark = pytest.mark.asyncio

NOON = 1_780_000_000.0


class Clock:
    def __init__(self) -> None:
        self.now = NOON

    def __call__(self) -> float:
        return self.now


def key_of(team: str, name: str = "svc", team_limits: Limits | None = None, **limits) -> Caller:
    return Caller(
        name=name, prefix=f"llmgw-t{uuid.uuid4().hex[:7]}", models=frozenset(),
        limits=Limits(**limits), team=team, team_limits=team_limits or Limits(),
    )  # fmt: skip


def a_team() -> str:
    return f"t{uuid.uuid4().hex[:8]}"  # counters of one test never meet another's


@pytest_asyncio.fixture(params=["redis", "local"])
async def limiter(request):
    url = settings.REDIS_URL if request.param == "redis" else ""
    made = RateLimiter(lambda: url, RouterMetrics(), clock=Clock())
    yield made
    await made.close()


def headers(error: RouterError) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in error.headers}


async def test_a_team_day_budget_is_shared_by_its_keys_and_stops_them_all(limiter):
    team = a_team()
    budget = Limits(tokens_per_day=100)
    first, second = key_of(team, "first", budget), key_of(team, "second", budget)
    admission = await limiter.admit(first)
    await limiter.charge(admission, 60)
    admission = await limiter.admit(second)
    await limiter.charge(admission, 50)  # 110 of the team's 100
    for key in (first, second):
        with pytest.raises(RouterError) as refused:
            await limiter.admit(key)
        error = refused.value
        assert error.status == 429 and error.code == "insufficient_quota"
        assert f"Team {team} (key {key.name}) reached its budget of 100 tokens for today" in (
            error.message
        )
        assert f"llmgw_ctl teams update {team}" in error.message
        assert headers(error)["x-llmgw-limited-by"] == "team"
    other_team = key_of(a_team(), "elsewhere", budget)
    assert await limiter.admit(other_team) is not None  # another team's budget is its own


async def test_the_more_restrictive_wins_and_the_refusal_names_it(limiter):
    team = a_team()
    key = key_of(team, "tight", Limits(requests_per_minute=10), requests_per_minute=2)
    for _ in range(2):
        await limiter.charge(await limiter.admit(key), 1)
    with pytest.raises(RouterError) as refused:
        await limiter.admit(key)  # the key's 2 before the team's 10
    assert refused.value.message.startswith("Key tight reached its limit of 2 requests")
    assert headers(refused.value)["x-llmgw-limited-by"] == "key"

    loose = [key_of(team, f"loose{i}", Limits(requests_per_minute=3)) for i in range(2)]
    await limiter.charge(await limiter.admit(loose[0]), 1)  # the team's third this minute
    with pytest.raises(RouterError) as refused:
        await limiter.admit(loose[1])
    assert f"Team {team} (key loose1) reached its limit of 3 requests" in refused.value.message


async def test_a_request_the_team_refuses_leaves_no_trace_on_its_key(limiter):
    team = a_team()
    key = key_of(team, "k", Limits(concurrency=1), requests_per_minute=2)
    held = await limiter.admit(key)  # the team's one place in flight
    for _ in range(3):
        with pytest.raises(RouterError):
            await limiter.admit(key)  # refused by the team, after the key admitted it
    await limiter.charge(held, 1)
    # Had the refused ones counted on the key, its 2 requests a minute would be spent.
    assert await limiter.admit(key) is not None


async def test_a_key_of_a_team_without_budgets_costs_no_team_counter():
    made = RateLimiter(lambda: settings.REDIS_URL, RouterMetrics(), clock=Clock())
    team = a_team()
    key = key_of(team, "k", requests_per_minute=5)
    admission = await made.admit(key)
    assert admission is not None and admission.also == []
    await made.charge(admission, 3)
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(settings.REDIS_URL)
    try:
        team_keys = counter_keys(team_counter_name(team), NOON)
        assert not await client.exists(team_keys.requests, team_keys.day)
    finally:
        await client.aclose()
        await made.close()


async def test_the_team_cap_per_key_is_named_when_it_refuses(limiter):
    key = Caller(
        name="capped", prefix=f"llmgw-t{uuid.uuid4().hex[:7]}", models=frozenset(),
        limits=Limits(requests_per_minute=1), team="ml", capped=frozenset({"requests_per_minute"}),
    )  # fmt: skip
    await limiter.charge(await limiter.admit(key), 1)
    with pytest.raises(RouterError) as refused:
        await limiter.admit(key)
    assert "Key capped reached team ml's cap per key, limit of 1 requests" in refused.value.message
    assert headers(refused.value)["x-llmgw-limited-by"] == "team-key-cap"


async def test_two_routers_hold_one_team_budget_together():
    team = a_team()
    budget = Limits(tokens_per_day=100)
    routers = [RateLimiter(lambda: settings.REDIS_URL, RouterMetrics(), clock=Clock())
               for _ in range(2)]  # fmt: skip
    keys = [key_of(team, "a", budget), key_of(team, "b", budget)]
    try:
        for router, key in zip(routers, keys, strict=True):
            await router.charge(await router.admit(key), 60)
        for router, key in zip(routers, keys, strict=True):
            with pytest.raises(RouterError):
                await router.admit(key)
    finally:
        for router in routers:
            await router.close()


async def test_a_model_closed_to_the_team_is_invisible_to_its_keys():
    cache = KeyCache()
    cache.replace([
        {"name": "a", "prefix": "llmgw-aaaaaaaa", "sha256": "1" * 64, "models": [],
         "team": "red", "team_models": ["gemma", "g"]},
        {"name": "b", "prefix": "llmgw-bbbbbbbb", "sha256": "2" * 64, "models": [],
         "team": "blue", "team_models": None},
        {"name": "old", "prefix": "llmgw-cccccccc", "sha256": "3" * 64, "models": []},
    ])  # fmt: skip
    red = cache._by_hash["1" * 64]  # type: ignore[index]
    blue = cache._by_hash["2" * 64]  # type: ignore[index]
    old = cache._by_hash["3" * 64]  # type: ignore[index]
    assert red.may_use(frozenset({"gemma"})) and not red.sees(frozenset({"qwen"}))
    assert blue.may_use(frozenset({"qwen"})) and old.may_use(frozenset({"qwen"}))
    assert cache.team_keys("red") == ["llmgw-aaaaaaaa"]
    assert cache.teams_of({"llmgw-aaaaaaaa", "llmgw-cccccccc"}) == {"red"}


async def test_a_teams_missing_day_total_is_rebuilt_from_its_ledger():
    """A Redis without the team's day total (restarted, or a new router's first request)
    asks the ledger for the team's, by its counter name, before admitting."""
    team = a_team()
    asked: list[str] = []

    async def ledger(counted_as: str, now: float) -> tuple[int, int]:
        asked.append(counted_as)
        return (95, 95) if counted_as == team_counter_name(team) else (0, 0)

    made = RateLimiter(lambda: settings.REDIS_URL, RouterMetrics(), clock=Clock(), ledger=ledger)
    key = key_of(team, "k", Limits(tokens_per_day=100))
    try:
        admission = await made.admit(key)  # 95 of 100 spent: still under
        await made.charge(admission, 10)
        with pytest.raises(RouterError, match=f"Team {team}"):
            await made.admit(key)
    finally:
        await made.close()
    assert asked == [team_counter_name(team)]
