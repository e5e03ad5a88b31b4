"""Places in flight taken in blocks (router/intake/places.py): a key whose only limit is a
cap of 32 or more is admitted without a Redis round trip per request, against the real
Redis, and routers that lease and routers that count per request hold one cap together.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest
import pytest_asyncio
import redis
from django.conf import settings

from protocol.rate_limits import INFLIGHT_HOLD_SECONDS, Limits, counter_keys
from router.errors import RouterError
from router.intake import script_batch
from router.intake.limits import RateLimiter
from router.intake.places import block_size
from router.metrics import RouterMetrics
from router.table.keys import Caller

pytestmark = pytest.mark.asyncio

NOON = 1_780_000_000.0


class Clock:
    def __init__(self, now: float = NOON) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def caller(prefix: str, **limits) -> Caller:
    return Caller(name="team-a", prefix=prefix, models=frozenset(), limits=Limits(**limits))


@pytest.fixture
def prefix() -> str:
    return f"llmgw-p{uuid.uuid4().hex[:7]}"  # counters of one test never meet another's


@pytest_asyncio.fixture
async def routers():
    """Routers on the real Redis sharing one clock, closed (their places given back)."""
    made: list[RateLimiter] = []
    clock = Clock()

    def router() -> RateLimiter:
        made.append(RateLimiter(lambda: settings.REDIS_URL, RouterMetrics(), clock=clock))
        return made[-1]

    yield router
    for limiter in made:
        await limiter.close()


def in_flight(prefix: str) -> list[str]:
    """The members of the key's in-flight set, as Redis holds them."""
    client = redis.Redis.from_url(settings.REDIS_URL)
    try:
        return [m.decode() for m in client.zrange(counter_keys(prefix, NOON).inflight, 0, -1)]
    finally:
        client.close()


async def test_a_cap_alone_costs_a_round_trip_a_block_not_a_request(routers, prefix, monkeypatch):
    scripts: list[int] = []
    run = script_batch.ScriptBatch.run

    async def counted(self, script, keys, args, wait=0.0):
        scripts.append(1)
        return await run(self, script, keys, args, wait)

    monkeypatch.setattr(script_batch.ScriptBatch, "run", counted)
    router, key = routers(), caller(prefix, concurrency=64)
    for _ in range(50):  # one after another, as one client's requests
        await router.charge(await router.admit(key), 12)
    assert len(scripts) == 1  # the first block
    running = [await router.admit(key) for _ in range(10)]
    assert 1 < len(scripts) <= 1 + 10 // block_size(64)
    held = in_flight(prefix)
    assert len(held) >= 10 and all(m.startswith("lease:") for m in held)
    for admission in running:
        await router.charge(admission, 12)
    leased = len(scripts)
    for _ in range(3):  # requests in flight rise and fall: no lease and no giving back
        running = [await router.admit(key) for _ in range(10)]
        for admission in running:
            await router.charge(admission, 12)
    assert len(scripts) == leased
    # The tick keeps what the requests took lately and a block; a tick without any gives
    # every place back.
    await router.tick()
    assert len(in_flight(prefix)) >= 10
    await router.tick()
    assert in_flight(prefix) == []


async def test_requests_arriving_together_share_a_lease_and_none_is_refused(routers, prefix):
    """64 requests at once under a cap of 64: each asking for a block of its own would
    lease the cap eight times over, and refuse most of them."""
    router = routers()
    key = caller(prefix, concurrency=64)
    admitted = await asyncio.gather(*(router.admit(key) for _ in range(64)))
    assert len({admission.request_id for admission in admitted}) == 64
    assert len(in_flight(prefix)) == 64
    with pytest.raises(RouterError):
        await router.admit(key)


async def test_the_express_way_takes_only_spare_places_and_gives_them_back(routers, prefix):
    """``admit_now`` (router/forward/express.py's) never leases: it takes a place the block
    holds spare, or says the request must be admitted the usual way; the cap holds."""
    router = routers()
    key = caller(prefix, concurrency=64)
    assert router.admit_now(key) == (False, None)  # no block yet: ``admit`` leases one
    first = await router.admit(key)
    spare = len(router.places.blocks[counter_keys(prefix, NOON).inflight].spare)
    taken = [router.admit_now(key) for _ in range(spare)]
    assert all(ok and admission.leased for ok, admission in taken)
    assert router.admit_now(key) == (False, None)  # none spare: never past the block
    assert len(in_flight(prefix)) == spare + 1  # nothing asked of Redis beyond the lease
    for _ok, admission in taken:
        assert router.settle_leased(admission)
    assert router.admit_now(key)[0]  # given back: spare again
    await router.charge(first, 0)
    assert router.admit_now(caller(prefix)) == (True, None)  # no limits: nothing to count
    budget = caller(f"{prefix}b", concurrency=64, tokens_per_day=1000)
    assert router.admit_now(budget) == (False, None)  # counted per request, in Redis


async def test_routers_that_lease_never_pass_the_cap_together(routers, prefix):
    a, b = routers(), routers()
    key = caller(prefix, concurrency=32)
    admitted = 0
    for _ in range(40):
        for router in (a, b):
            try:
                await router.admit(key)
                admitted += 1
            except RouterError as refused:
                assert "its limit of 32 requests in flight at once" in refused.message
    assert admitted == 32
    assert len(in_flight(prefix)) == 32


async def test_a_router_counting_per_request_shares_the_cap_with_leasing_ones(routers, prefix):
    """One key's limits as two routers see them while an update reaches them: one with the
    cap alone (leased), one with a requests limit too (each request counted in Redis)."""
    leasing, counting = routers(), routers()
    for _ in range(20):
        await leasing.admit(caller(prefix, concurrency=32))
    both = caller(prefix, concurrency=32, requests_per_minute=1000)
    for _ in range(12):
        await counting.admit(both)
    with pytest.raises(RouterError):
        await counting.admit(both)
    with pytest.raises(RouterError):
        await leasing.admit(caller(prefix, concurrency=32))


async def test_spare_places_go_back_a_tick_after_nobody_took_them(routers, prefix):
    a, b = routers(), routers()
    key = caller(prefix, concurrency=32)
    running = [await a.admit(key) for _ in range(32)]
    with pytest.raises(RouterError):
        await b.admit(key)
    for admission in running:
        await a.charge(admission, 1)
    # Router a keeps them a tick, in case its clients ask again, and then gives them back.
    assert len(in_flight(prefix)) == 32
    await a.tick()
    with pytest.raises(RouterError):
        await b.admit(key)
    await a.tick()
    assert in_flight(prefix) == []
    assert await b.admit(key) is not None


async def test_a_stopping_router_gives_back_every_place_it_holds(routers, prefix):
    router = routers()
    key = caller(prefix, concurrency=64)
    for _ in range(5):
        await router.admit(key)
    assert len(in_flight(prefix)) >= 5
    await router.close()
    assert in_flight(prefix) == []


async def test_the_places_of_a_router_that_died_run_out(routers, prefix):
    dead, alive = routers(), routers()
    key = caller(prefix, concurrency=32)
    for _ in range(32):
        await dead.admit(key)
    dead.places.blocks.clear()  # it died: nothing renews or gives back its places
    with pytest.raises(RouterError):
        await alive.admit(key)
    alive.clock.now += INFLIGHT_HOLD_SECONDS + 1
    assert await alive.admit(key) is not None


async def test_places_a_restarted_redis_lost_are_held_again_at_the_next_renewal(routers, prefix):
    router = routers()
    key = caller(prefix, concurrency=64)
    for _ in range(3):
        await router.admit(key)
    held = sorted(in_flight(prefix))
    client = redis.Redis.from_url(settings.REDIS_URL)
    client.delete(counter_keys(prefix, NOON).inflight)
    client.close()
    await router.renew_once()
    assert sorted(in_flight(prefix)) == held


async def test_a_place_the_team_refused_goes_back_to_its_block(routers, prefix):
    """The key's cap is leased, its team's cap of one counted per request: the team's
    refusal gives the key's place back, and the key holds only what runs."""
    router = routers()
    team = f"t{prefix[-7:]}"
    key = Caller(name="k", prefix=prefix, models=frozenset(), limits=Limits(concurrency=32),
                 team=team, team_limits=Limits(concurrency=1))  # fmt: skip
    running = await router.admit(key)
    with pytest.raises(RouterError) as refused:
        await router.admit(key)
    assert refused.value.message.startswith(f"Team {team} ")
    block = router.places.blocks[counter_keys(prefix, NOON).inflight]
    assert block.taken == 1
    await router.charge(running, 3)
    assert await router.admit(key) is not None
    assert block.taken == 1


async def test_a_tick_redis_does_not_answer_counts_alone_for_a_while(routers, prefix,
                                                                     monkeypatch):  # fmt: skip
    router = routers()
    await router.admit(caller(prefix, concurrency=64))

    async def unanswered(run):
        raise ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")

    monkeypatch.setattr(router.places, "tick", unanswered)
    await router.tick()
    assert router.metrics.limits_shared._value.get() == 0
    assert not router._use_redis(router.clock())  # not asked again at the next tick
