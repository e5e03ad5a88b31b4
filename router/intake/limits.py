"""Per-key limits, enforced by every router process together, against totals that last.

Counters live in Redis (names in ``protocol.rate_limits``) and change only through Lua
scripts, one that admits a request and one that settles it, so two routers can never both
take the last request of a minute. Admission reserves the request's worst case (its
``max_tokens``, or the router's default, plus its prompt's size) against the key's
tokens per minute, day and month; settling replaces the reservation with what the answer
used. So routers together overshoot a budget by at most the last reservation admitted.
A reservation whose router died is released with its place in flight, after
``INFLIGHT_HOLD_SECONDS``. A key whose only limit is a cap of 32 or more requests in flight
takes its places in blocks instead, without a round trip per request (places.py).

The day's and month's totals of record are the usage rows in PostgreSQL (the ledger,
router/usage/accounting.py, written within a second of each answer); Redis holds them as a
cache. A key with a day or month budget whose counter is missing (a Redis restart without
its append-only file, a new day) has it rebuilt from the ledger before it is admitted.

When Redis does not answer, each process counts alone by the same rules, says so in
/metrics (``llmgw_router_rate_limits_shared`` 0), and tries Redis again shortly after. A
day or month budget is then not a fresh one: each router may spend its share of what was
left when Redis was last heard (the routers that admitted the key lately share it), and
when Redis answers again the counters are raised to the ledger, which holds what every
router spent meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from protocol.rate_limits import (
    INFLIGHT_HOLD_SECONDS,
    INFLIGHT_RENEW_SECONDS,
    CounterKeys,
    Limits,
    counter_keys,
    day_ends,
    month_ends,
)  # fmt: skip
from router.errors import RouterError
from router.intake.counters import ADMIT, MERGE, RELEASE, SETTLE, LocalCounters, Tally, as_text
from router.intake.limited import (
    Admission,
    Subject,
    counted_subjects,
    has_budget,
    limit_headers,
    refusal,
)
from router.intake.places import TICK_SECONDS, LeasedPlaces, leased
from router.intake.script_batch import ScriptBatch, limits_client
from router.metrics import RouterMetrics
from router.table.keys import Caller

logger = logging.getLogger(__name__)

# After Redis failed to answer, count in this process for this long before trying again:
# short, since routers that count alone and routers that hear Redis do not see each other.
REDIS_RETRY_SECONDS = 1.0
# A limit check must not slow a request down much when Redis is slow: give up on it fast.
REDIS_TIMEOUT = 0.5
# A settling waits at most this long to go to Redis with the next admission (ahead of it:
# the place it frees is free for that admission), rather than a trip of its own.
SETTLE_WAIT_SECONDS = 0.002
# After Redis answers again, the totals are raised to the ledger once at once and once this
# much later, when every router has written what it counted (the ledger lags a second).
MERGE_AGAIN_SECONDS = 3.0
# Requests admitted in Redis and settled while it did not answer, kept to give their places
# back: past this many (a long outage), their holds run out on their own.
MAX_UNRELEASED = 10_000
# A router counts among those sharing a key's budget for this long after it admitted it.
ROUTER_SHARE_SECONDS = 600

# The ledger: a key's tokens this UTC day and month, from the usage rows (and what this
# router counted and has not written yet). None: no ledger (a router on a static file).
Ledger = Callable[[str, float], Awaitable[tuple[int, int]]]


@dataclass
class RateLimiter:
    """Admits and settles the requests of keys that carry limits."""

    redis_url: Callable[[], str]  # "" while unknown (router-only mode has none)
    metrics: RouterMetrics
    clock: Callable[[], float] = time.time
    local: LocalCounters = field(default_factory=LocalCounters)
    ledger: Ledger | None = None
    router_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    _client: Any = None
    _batch: ScriptBatch | None = None
    _merge: Any = None
    _redis_down_until: float = 0.0
    _outage: bool = False  # Redis failed since it last answered: merge back when it does
    # Requests admitted and not settled yet, by id: their holds are renewed while they run.
    _holding: dict[str, CounterKeys] = field(default_factory=dict)
    _merge_again_at: float = 0.0
    # Requests admitted in Redis and settled here while it did not answer.
    _unreleased: list[tuple[CounterKeys, str]] = field(default_factory=list)
    places: LeasedPlaces = field(init=False)

    def __post_init__(self) -> None:
        self.places = LeasedPlaces(self.router_id)

    async def admit(self, caller: Caller, reserve: int = 0) -> Admission | None:
        """Count the request against its key and its key's team, reserving ``reserve``
        tokens (its worst case) for it in each, or raise the 429 to answer, naming the
        limit reached (the key's, or the team's); None: neither has limits.

        The key is counted first, then the team, each by its own script (their counters
        live apart, each in its own Redis Cluster slot); a request the team refuses is
        given back to the key's counters, so it leaves no trace there."""
        subjects = counted_subjects(caller)
        if not subjects:
            return None
        now = self.clock()
        admitted: list[Admission] = []
        for subject in subjects:
            try:
                admitted.append(await self._admit_one(caller, subject, now, reserve))
            except RouterError:
                for earlier in admitted:
                    await self._release(earlier, now)
                raise
        first, *others = admitted
        first.also = others
        named = {name for name, _value in first.headers}
        first.headers += [h for other in others for h in other.headers if h[0] not in named]
        return first

    def admit_now(self, caller: Caller) -> tuple[bool, Admission | None]:
        """``admit`` without a wait (forward/express.py): (True, the admission, None where
        nothing counts it), or (False, None) unless it has caps alone, places spare here."""
        now, subjects = self.clock(), counted_subjects(caller)
        if not subjects:
            return True, None
        if self._outage or self._merge_again_at or not self._use_redis(now):
            return False, None
        admitted = self.places.admit_now(subjects, now)
        if admitted is None:
            return False, None
        admitted[0].also = admitted[1:]
        return True, admitted[0]

    def settle_leased(self, admission: Admission) -> bool:
        """``charge`` without a wait, for an admission of places alone; False: not one."""
        if not all(one.leased for one in (admission, *admission.also)):
            return False
        for one in (admission, *admission.also):
            self.places.put_back(one.keys, one.request_id)
        return True

    async def _admit_one(
        self, caller: Caller, subject: Subject, now: float, reserve: int
    ) -> Admission:
        limits = subject.limits
        if not (limits.tokens_per_minute or has_budget(limits)):
            reserve = 0  # nothing to reserve against
        keys = counter_keys(subject.counted_as, now)
        if leased(limits) and self._use_redis(now):
            try:
                await self._merge_back(now)
                cap = limits.concurrency or 0
                place, inflight = await self.places.take(keys, cap, now, self._run)
            except Exception as exc:  # any failure of Redis: counted here, as below
                self._redis_failed(now, exc)
            else:
                if place is None:
                    self.metrics.rate_limited.labels("concurrency").inc()
                    tally = Tally("concurrency", 0, 0, 0, 0, inflight, 0, 0)
                    raise refusal(caller, tally, now, [], subject)
                return Admission(place, keys, [], True, limits, leased=True)
        request_id = uuid.uuid4().hex
        tally, shared = await self._admit(subject.counted_as, keys, limits, now, request_id,
                                          reserve)  # fmt: skip
        headers = limit_headers(limits, tally)
        if tally.refused:
            self.metrics.rate_limited.labels(tally.refused).inc()
            raise refusal(caller, tally, now, headers, subject)
        self._holding[request_id] = keys
        return Admission(request_id, keys, headers, shared, limits, reserve)

    async def _release(self, admission: Admission, now: float) -> None:
        """Give an admission back: the request was refused by the next subject."""
        self._holding.pop(admission.request_id, None)
        keys = admission.keys
        if admission.leased:
            self.places.put_back(keys, admission.request_id)
            return
        if admission.shared and self._use_redis(now):
            try:
                await self._batch.run(  # type: ignore[union-attr]
                    RELEASE, [keys.requests, keys.inflight, keys.reserved], [admission.request_id]
                )
                return
            except Exception as exc:  # any failure of Redis: given back when it answers
                self._redis_failed(now, exc)
                if len(self._unreleased) < MAX_UNRELEASED:
                    self._unreleased.append((keys, admission.request_id))
        self.local.release(keys, admission.request_id)

    async def charge(self, admission: Admission, tokens: int) -> None:
        """Settle a request: its reservation becomes the tokens its answer used, and its
        place in flight goes, for its key and its team."""
        for one in (admission, *admission.also):
            await self._settle(one, tokens)

    async def _settle(self, admission: Admission, tokens: int) -> None:
        now = self.clock()
        if admission.leased:  # a cap alone: nothing else to count
            self.places.put_back(admission.keys, admission.request_id)
            return
        limits = admission.limits
        args = (int(now), tokens, admission.request_id,
                int(day_ends(now) - now) + 3600, int(month_ends(now) - now) + 3600,
                1 if limits.tokens_per_day and self.ledger else 0,
                1 if limits.tokens_per_month and self.ledger else 0)  # fmt: skip
        keys = admission.keys
        prefix = keys.prefix
        self._holding.pop(admission.request_id, None)
        if admission.shared and self._use_redis(now):
            try:
                await self._merge_back(now)
                await self._batch.run(  # type: ignore[union-attr]
                    SETTLE,
                    [keys.tokens, keys.day, keys.month, keys.inflight, keys.reserved],
                    args,
                    wait=SETTLE_WAIT_SECONDS,
                )
                return
            except Exception as exc:  # any failure of Redis: count here rather than lose it
                self._redis_failed(now, exc)
        if admission.shared and len(self._unreleased) < MAX_UNRELEASED:
            # Its place in flight and its reservation in Redis, given back when Redis
            # answers: else they hold the key's concurrency and budget for two minutes.
            self._unreleased.append((keys, admission.request_id))
        self.local.charge(keys, now, admission.request_id, tokens, prefix)

    async def renew_holds(self) -> None:
        """Until cancelled: spare leased places given back at each tick (places.py), and
        every INFLIGHT_RENEW_SECONDS the places in flight (and their reservations) of this
        router's running requests held on, so only a dead router's run out."""
        renewed = time.monotonic()
        while True:
            await asyncio.sleep(TICK_SECONDS)
            await self.tick()
            if time.monotonic() - renewed >= INFLIGHT_RENEW_SECONDS:
                renewed = time.monotonic()
                await self.renew_once()

    async def tick(self) -> None:
        """Spare leased places given back (places.py); a failing Redis is left a while."""
        now = self.clock()
        if self.places.blocks and self._use_redis(now):
            try:
                await self.places.tick(self._run)
            except Exception as exc:  # any failure of Redis: those given back run out
                self._redis_failed(now, exc)

    async def renew_once(self) -> None:
        now = self.clock()
        until = now + INFLIGHT_HOLD_SECONDS
        holding = list(self._holding.items())
        for request_id, keys in holding:
            local = self.local.inflight.get(keys.inflight)
            if local is not None and request_id in local:
                local[request_id] = until
        places = self.places.held()
        if not (holding or places) or not self._use_redis(now):
            return
        try:
            async with self._client.pipeline(transaction=False) as pipe:
                for request_id, keys in holding:
                    pipe.zadd(keys.inflight, {request_id: int(until * 1000)}, xx=True)
                    pipe.pexpire(keys.inflight, int(INFLIGHT_HOLD_SECONDS * 1000) + 60000)
                    pipe.pexpire(keys.reserved, int(INFLIGHT_HOLD_SECONDS * 1000) + 60000)
                # Leased places are added again where a Redis that restarted lost them: the
                # router admits from them, so the set counts them.
                for counter, place in places:
                    pipe.zadd(counter, {place: int(until * 1000)})
                    pipe.pexpire(counter, int(INFLIGHT_HOLD_SECONDS * 1000) + 60000)
                await pipe.execute()
        except Exception as exc:  # noqa: BLE001  # held on at the next renewal
            logger.warning("places in flight not renewed: %s", exc)

    async def raise_from_ledger(self, key_prefixes: set[str]) -> None:
        """These keys' totals raised to the ledger's: after a gone router's journal was
        adopted (its last second and the prompts of what it was answering)."""
        now = self.clock()
        if self.ledger is None:
            return
        if not self._use_redis(now):
            self.local.charged |= key_prefixes  # raised when Redis answers again
            return
        for prefix in key_prefixes:
            day, month = await self.ledger(prefix, now)
            await self._raise_to(counter_keys(prefix, now), day, month, now)

    async def close(self) -> None:
        if self._batch is not None:
            if self.places.blocks:
                try:
                    await self.places.give_back_all(self._run)
                except Exception as exc:  # noqa: BLE001  # they run out on their own
                    logger.warning("places in flight not given back at stop: %s", exc)
            await self._batch.close()
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def _admit(
        self, prefix: str, keys: CounterKeys, limits: Limits, now: float, request_id: str,
        reserve: int,
    ) -> tuple[Tally, bool]:  # fmt: skip
        if self._use_redis(now):
            try:
                await self._merge_back(now)
                reply = await self._run_admit(keys, limits, now, request_id, reserve)
                if as_text(reply[0]) == "ledger":  # a budget's total is missing: rebuild it
                    await self._rebuild(prefix, keys, now)
                    reply = await self._run_admit(keys, limits, now, request_id, reserve)
                tally = Tally(as_text(reply[0]), *(int(n) for n in reply[1:]))
                if has_budget(limits):
                    self.local.learn(prefix, keys, tally.day, tally.month, tally.routers)
                return tally, True
            except Exception as exc:  # any failure of Redis: the local count keeps serving
                self._redis_failed(now, exc)
        if has_budget(limits) and self.ledger is not None and not self.local.known(keys):
            # Not a fresh budget: what the ledger says was spent (else what Redis said last).
            day = self.local.base.get(keys.day, 0)
            month = self.local.base.get(keys.month, 0)
            try:
                day, month = await self.ledger(prefix, now)
            except Exception as exc:  # noqa: BLE001  # no ledger either
                logger.warning("no ledger for key %s while Redis is away: %s", prefix, exc)
            self.local.learn(prefix, keys, day, month, self.local.sharers.get(prefix, 1))
        return self.local.admit(keys, limits, now, request_id, reserve, prefix), False

    def _run(self, script: str, keys: list[str], args: list[Any]) -> Awaitable[Any]:
        return self._batch.run(script, keys, args)  # type: ignore[union-attr]

    async def _run_admit(
        self, keys: CounterKeys, limits: Limits, now: float, request_id: str, reserve: int
    ) -> Any:
        args = (
            int(now * 1000), limits.requests_per_minute or 0, limits.tokens_per_minute or 0,
            limits.tokens_per_day or 0, limits.tokens_per_month or 0,
            limits.concurrency or 0, request_id, int((now + INFLIGHT_HOLD_SECONDS) * 1000),
            reserve, self.router_id, 1 if self.ledger is not None else 0, ROUTER_SHARE_SECONDS,
        )  # fmt: skip
        return await self._batch.run(ADMIT, list(keys), args)  # type: ignore[union-attr]

    async def _rebuild(self, prefix: str, keys: CounterKeys, now: float) -> None:
        """A key's day and month totals, missing from Redis, put back from the ledger (from
        what Redis said last, where the ledger cannot answer)."""
        assert self.ledger is not None
        try:
            day, month = await self.ledger(prefix, now)
        except Exception as exc:  # noqa: BLE001  # the database is away too
            logger.warning("key %s's totals are not in Redis and the ledger does not answer "
                           "(%s): counting from what Redis said last", prefix, exc)  # fmt: skip
            day, month = self.local.base.get(keys.day, 0), self.local.base.get(keys.month, 0)
        await self._raise_to(keys, day, month, now)

    async def _raise_to(self, keys: CounterKeys, day: int, month: int, now: float,
                        spent: tuple[int, int] = (0, 0)) -> None:  # fmt: skip
        await self._merge(  # type: ignore[misc]
            keys=[keys.day, keys.month],
            args=[*spent, day, month, int(day_ends(now) - now) + 3600,
                  int(month_ends(now) - now) + 3600],
        )  # fmt: skip

    async def _merge_back(self, now: float) -> None:
        """Once Redis answers after an outage: what this router spent alone added to the
        totals of the keys with budgets, and the totals raised to the ledger's, which holds
        what every router spent (a gone router's adopted journal too)."""
        if self._outage:
            self._outage = False
            # Once more when every router has written what it counted meanwhile.
            self._merge_again_at = now + MERGE_AGAIN_SECONDS
        elif self._merge_again_at and now >= self._merge_again_at:
            self._merge_again_at = 0.0
        else:
            return
        # The keys charged here meanwhile, and every key with a budget this router counted:
        # a Redis that restarted from its append-only file may have lost its last second.
        charged = self.local.charged | set(self.local.sharers)
        totals = dict(self.local.totals)  # forgotten once merged: a failure merges it again
        for prefix in charged:
            keys = counter_keys(prefix, now)
            day, month = -1, -1
            if self.ledger is not None:
                try:
                    day, month = await self.ledger(prefix, now)
                except Exception as exc:  # noqa: BLE001  # the next miss rebuilds it
                    logger.warning("key %s's totals not merged from the ledger: %s", prefix, exc)
            spent = (totals.get(keys.day, 0), totals.get(keys.month, 0))
            await self._raise_to(keys, day, month, now, spent)
        self.local.forget_spent()
        await self._release_settled_here()
        if charged:
            logger.info("Redis answers again: %d keys' totals merged", len(charged))

    async def _release_settled_here(self) -> None:
        """The places in flight and reservations, in Redis, of the requests it admitted
        and that were settled here while it did not answer."""
        unreleased, self._unreleased = self._unreleased, []
        if not unreleased:
            return
        try:
            async with self._client.pipeline(transaction=False) as pipe:
                for keys, request_id in unreleased:
                    pipe.zrem(keys.inflight, request_id)
                    pipe.hdel(keys.reserved, request_id)
                await pipe.execute()
        except Exception:
            self._unreleased = unreleased + self._unreleased  # with the next merge
            raise

    def _use_redis(self, now: float) -> bool:
        if now < self._redis_down_until:
            return False
        if self._client is None:
            url = self.redis_url()
            if not url:
                self.metrics.limits_shared.set(0)
                return False
            self._client = limits_client(url, REDIS_TIMEOUT)
            # Admissions, settlings and releases go in batches, one pipeline a turn.
            self._batch = ScriptBatch(self._client)
            self._merge = self._client.register_script(MERGE)
        self.metrics.limits_shared.set(1)
        return True

    def _redis_failed(self, now: float, exc: Exception) -> None:
        if self._redis_down_until <= now:
            logger.warning(
                "per-key limits are counted in this process alone for %.0f s: Redis does not "
                "answer (%s)", REDIS_RETRY_SECONDS, exc,
            )  # fmt: skip
        self._redis_down_until = now + REDIS_RETRY_SECONDS
        if not self._outage:
            self.local.outage_began()
        self._outage = True
        self.metrics.limits_shared.set(0)
