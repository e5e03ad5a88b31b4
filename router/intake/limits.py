"""Per-key limits, enforced by every router process together.

Counters live in Redis (names in ``protocol.rate_limits``) and change only through two
Lua scripts, one that admits a request and one that charges its tokens, so two routers
can never both take the last request of a minute. Tokens are known only once an answer
is whole, so a key is admitted while it is under its token limits and charged after:
each router can overshoot by what it had in flight when the limit was reached.

When Redis does not answer, each process counts alone by the same rules, says so in
/metrics (``llmgw_router_rate_limits_shared`` 0), and tries Redis again shortly after.
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from protocol.rate_limits import (
    INFLIGHT_HOLD_SECONDS,
    CounterKeys,
    Limits,
    counter_keys,
    day_ends,
    month_ends,
)  # fmt: skip
from router.errors import RouterError
from router.metrics import RouterMetrics
from router.table.keys import Caller

logger = logging.getLogger(__name__)

# After Redis failed to answer, count in this process for this long before trying again.
REDIS_RETRY_SECONDS = 5.0
# A limit check must not slow a request down much when Redis is slow: give up on it fast.
REDIS_TIMEOUT = 0.5

ADMIT = """
local now, id, hold_until = tonumber(ARGV[1]), ARGV[7], tonumber(ARGV[8])
local rpm, tpm = tonumber(ARGV[2]), tonumber(ARGV[3])
local per_day, per_month, concurrency = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local second = math.floor(now / 1000)

redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - 60000)
local requests = redis.call('ZCARD', KEYS[1])
local requests_reset = 0
if requests > 0 then
  local oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  requests_reset = tonumber(oldest[2]) + 60000 - now
end

local tokens, buckets = 0, {}
local flat = redis.call('HGETALL', KEYS[2])
for i = 1, #flat, 2 do
  local s, n = tonumber(flat[i]), tonumber(flat[i + 1])
  if s <= second - 60 then
    redis.call('HDEL', KEYS[2], flat[i])
  else
    tokens = tokens + n
    buckets[#buckets + 1] = {s, n}
  end
end
table.sort(buckets, function(a, b) return a[1] < b[1] end)
-- When enough tokens have left the minute for the key to be under its limit again.
local tokens_reset, left = 0, tokens
for _, bucket in ipairs(buckets) do
  left = left - bucket[2]
  tokens_reset = (bucket[1] + 60 - second) * 1000
  if tpm <= 0 or left < tpm then break end
end

local day = tonumber(redis.call('GET', KEYS[3]) or '0')
local month = tonumber(redis.call('GET', KEYS[4]) or '0')
redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', now)
local inflight = redis.call('ZCARD', KEYS[5])

local refused = ''
if rpm > 0 and requests >= rpm then refused = 'requests'
elseif tpm > 0 and tokens >= tpm then refused = 'tokens'
elseif per_day > 0 and day >= per_day then refused = 'day'
elseif per_month > 0 and month >= per_month then refused = 'month'
elseif concurrency > 0 and inflight >= concurrency then refused = 'concurrency'
end
if refused == '' then
  redis.call('ZADD', KEYS[1], now, id)
  redis.call('PEXPIRE', KEYS[1], 61000)
  requests = requests + 1
  if requests == 1 then requests_reset = 60000 end
  if concurrency > 0 then
    redis.call('ZADD', KEYS[5], hold_until, id)
    redis.call('PEXPIRE', KEYS[5], hold_until - now + 60000)  -- Redis's clock may differ
    inflight = inflight + 1
  end
end
return {refused, requests, tokens, day, month, inflight,
        math.floor(requests_reset), math.floor(tokens_reset)}
"""

CHARGE = """
local tokens = tonumber(ARGV[2])
if tokens > 0 then
  redis.call('HINCRBY', KEYS[1], ARGV[1], tokens)
  redis.call('EXPIRE', KEYS[1], 61)
  redis.call('INCRBY', KEYS[2], tokens)
  redis.call('EXPIRE', KEYS[2], ARGV[4])
  redis.call('INCRBY', KEYS[3], tokens)
  redis.call('EXPIRE', KEYS[3], ARGV[5])
end
redis.call('ZREM', KEYS[4], ARGV[3])
return 1
"""


class Tally(NamedTuple):
    """A key's counters as one admission found them (after counting it, if admitted)."""

    refused: str  # "" admitted; else the limit reached: requests, tokens, day, month, concurrency
    requests: int  # in the last minute
    tokens: int  # in the last minute
    day: int  # tokens this UTC day
    month: int  # tokens this UTC month
    inflight: int
    requests_reset_ms: int  # until the oldest request of the minute leaves it
    tokens_reset_ms: int  # until the tokens of the minute are under the limit again


@dataclass
class Admission:
    """An admitted request: what to charge it to, and the headers its answer carries."""

    request_id: str
    keys: CounterKeys
    headers: list[tuple[bytes, bytes]]
    shared: bool  # counted in Redis, not only in this process


class LocalCounters:
    """The scripts' rules in one process's memory, for while Redis does not answer."""

    def __init__(self) -> None:
        self.requests: dict[str, dict[str, float]] = {}
        self.tokens: dict[str, dict[int, int]] = {}
        self.totals: dict[str, int] = {}
        self.inflight: dict[str, dict[str, float]] = {}

    def admit(self, keys: CounterKeys, limits: Limits, now: float, request_id: str) -> Tally:
        requests = self.requests.setdefault(keys.requests, {})
        for old in [r for r, at in requests.items() if at <= now - 60]:
            del requests[old]
        second = int(now)
        buckets = self.tokens.setdefault(keys.tokens, {})
        for past in [s for s in buckets if s <= second - 60]:
            del buckets[past]
        tokens = sum(buckets.values())
        inflight = self.inflight.setdefault(keys.inflight, {})
        for old in [r for r, until in inflight.items() if until <= now]:
            del inflight[old]
        day, month = self.totals.get(keys.day, 0), self.totals.get(keys.month, 0)
        refused = _refused(limits, len(requests), tokens, day, month, len(inflight))
        if not refused:
            requests[request_id] = now
            if limits.concurrency:
                inflight[request_id] = now + INFLIGHT_HOLD_SECONDS
        oldest = min(requests.values(), default=now)
        tokens_reset, left = 0, tokens
        for bucket_second, count in sorted(buckets.items()):
            left -= count
            tokens_reset = (bucket_second + 60 - second) * 1000
            if not limits.tokens_per_minute or left < limits.tokens_per_minute:
                break
        return Tally(
            refused, len(requests), tokens, day, month, len(inflight),
            int((oldest + 60 - now) * 1000), tokens_reset,
        )  # fmt: skip

    def charge(self, keys: CounterKeys, now: float, request_id: str, tokens: int) -> None:
        if tokens > 0:
            buckets = self.tokens.setdefault(keys.tokens, {})
            buckets[int(now)] = buckets.get(int(now), 0) + tokens
            for total in (keys.day, keys.month):
                self.totals[total] = self.totals.get(total, 0) + tokens
        self.inflight.get(keys.inflight, {}).pop(request_id, None)


def _refused(
    limits: Limits, requests: int, tokens: int, day: int, month: int, inflight: int
) -> str:
    """The first limit reached, in the scripts' order; "" when none is."""
    checks = (
        ("requests", limits.requests_per_minute, requests),
        ("tokens", limits.tokens_per_minute, tokens),
        ("day", limits.tokens_per_day, day),
        ("month", limits.tokens_per_month, month),
        ("concurrency", limits.concurrency, inflight),
    )
    return next((name for name, limit, used in checks if limit and used >= limit), "")


@dataclass
class RateLimiter:
    """Admits and charges the requests of keys that carry limits."""

    redis_url: Callable[[], str]  # "" while unknown (router-only mode has none)
    metrics: RouterMetrics
    clock: Callable[[], float] = time.time
    local: LocalCounters = field(default_factory=LocalCounters)
    _client: Any = None
    _scripts: tuple[Any, Any] | None = None
    _redis_down_until: float = 0.0

    async def admit(self, caller: Caller) -> Admission | None:
        """Count the request against its key, or raise the 429 to answer; None: no limits."""
        limits = caller.limits
        if not limits:
            return None
        now = self.clock()
        request_id = uuid.uuid4().hex
        keys = counter_keys(caller.prefix, now)
        tally, shared = await self._admit(keys, limits, now, request_id)
        headers = limit_headers(limits, tally)
        if tally.refused:
            self.metrics.rate_limited.labels(tally.refused).inc()
            raise refusal(caller, tally, now, headers)
        return Admission(request_id, keys, headers, shared)

    async def charge(self, admission: Admission, tokens: int) -> None:
        """Add the answer's tokens to its key and let its place in flight go."""
        now = self.clock()
        args = (int(now), tokens, admission.request_id,
                int(day_ends(now) - now) + 3600, int(month_ends(now) - now) + 3600)  # fmt: skip
        keys = admission.keys
        if admission.shared and self._use_redis(now):
            try:
                await self._scripts[1](  # type: ignore[index]
                    keys=[keys.tokens, keys.day, keys.month, keys.inflight], args=args
                )
                return
            except Exception as exc:  # any failure of Redis: count here rather than lose it
                self._redis_failed(now, exc)
        self.local.charge(keys, now, admission.request_id, tokens)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def _admit(
        self, keys: CounterKeys, limits: Limits, now: float, request_id: str
    ) -> tuple[Tally, bool]:
        if self._use_redis(now):
            args = (
                int(now * 1000), limits.requests_per_minute or 0, limits.tokens_per_minute or 0,
                limits.tokens_per_day or 0, limits.tokens_per_month or 0,
                limits.concurrency or 0, request_id, int((now + INFLIGHT_HOLD_SECONDS) * 1000),
            )  # fmt: skip
            try:
                reply = await self._scripts[0](keys=list(keys), args=args)  # type: ignore[index]
                refused = reply[0].decode() if isinstance(reply[0], bytes) else reply[0]
                return Tally(refused, *(int(n) for n in reply[1:])), True
            except Exception as exc:  # any failure of Redis: the local count keeps serving
                self._redis_failed(now, exc)
        return self.local.admit(keys, limits, now, request_id), False

    def _use_redis(self, now: float) -> bool:
        if now < self._redis_down_until:
            return False
        if self._client is None:
            url = self.redis_url()
            if not url:
                self.metrics.limits_shared.set(0)
                return False
            import redis.asyncio as aioredis

            self._client = aioredis.Redis.from_url(
                url, socket_timeout=REDIS_TIMEOUT, socket_connect_timeout=REDIS_TIMEOUT
            )
            self._scripts = (
                self._client.register_script(ADMIT), self._client.register_script(CHARGE)
            )  # fmt: skip
        self.metrics.limits_shared.set(1)
        return True

    def _redis_failed(self, now: float, exc: Exception) -> None:
        if self._redis_down_until <= now:
            logger.warning(
                "per-key limits are counted in this process alone for %.0f s: Redis does not "
                "answer (%s)", REDIS_RETRY_SECONDS, exc,
            )  # fmt: skip
        self._redis_down_until = now + REDIS_RETRY_SECONDS
        self.metrics.limits_shared.set(0)


def limit_headers(limits: Limits, tally: Tally) -> list[tuple[bytes, bytes]]:
    """OpenAI's ``x-ratelimit-*`` headers for the per-minute limits the key has."""
    headers = []
    for kind, limit, used, reset_ms in (
        ("requests", limits.requests_per_minute, tally.requests, tally.requests_reset_ms),
        ("tokens", limits.tokens_per_minute, tally.tokens, tally.tokens_reset_ms),
    ):
        if limit:
            headers += [
                (f"x-ratelimit-limit-{kind}".encode(), str(limit).encode()),
                (f"x-ratelimit-remaining-{kind}".encode(), str(max(0, limit - used)).encode()),
                (f"x-ratelimit-reset-{kind}".encode(), reset_text(reset_ms).encode()),
            ]
    return headers


def reset_text(ms: int) -> str:
    """A wait as OpenAI writes it in ``x-ratelimit-reset-*``: 20ms, 1s, 6m0s."""
    if ms < 1000:
        return f"{max(0, ms)}ms"
    seconds = math.ceil(ms / 1000)
    return f"{seconds // 60}m{seconds % 60}s" if seconds >= 60 else f"{seconds}s"


def refusal(
    caller: Caller, tally: Tally, now: float, headers: list[tuple[bytes, bytes]]
) -> RouterError:
    """The 429 for the limit ``tally`` says was reached, with how long to wait."""
    limits, name = caller.limits, caller.name
    kind = tally.refused
    if kind == "requests":
        wait = tally.requests_reset_ms / 1000
        message = f"its limit of {limits.requests_per_minute} requests per minute"
    elif kind == "tokens":
        wait = tally.tokens_reset_ms / 1000
        message = (
            f"its limit of {limits.tokens_per_minute} tokens per minute "
            f"({tally.tokens} used in the last minute)"
        )
    elif kind == "day":
        wait = day_ends(now) - now
        message = f"its budget of {limits.tokens_per_day} tokens for today (UTC)"
    elif kind == "month":
        wait = month_ends(now) - now
        message = f"its budget of {limits.tokens_per_month} tokens for this month (UTC)"
    else:
        wait = 1.0
        message = f"its limit of {limits.concurrency} requests in flight at once"
    retry_after = max(1, math.ceil(wait))
    budget = kind in ("day", "month")
    error = "insufficient_quota" if budget else "rate_limit_exceeded"
    return RouterError(
        429,
        f"Key {name} reached {message}; try again in {retry_after} s"
        + (", or ask an operator to raise it (`llmgw_ctl keys update`)." if budget else "."),
        error,
        error,
        headers=[*headers, (b"retry-after", str(retry_after).encode())],
    )
