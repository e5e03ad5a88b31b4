"""The per-key (and per-team) counters, where they live: the Lua scripts that admit and
settle requests in Redis, shared by every router (router/intake/limits.py runs them), and
the same rules in one process's memory for while Redis does not answer (``LocalCounters``).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from protocol.rate_limits import INFLIGHT_HOLD_SECONDS, CounterKeys, Limits

ADMIT = """
local now, id, hold_until = tonumber(ARGV[1]), ARGV[7], tonumber(ARGV[8])
local rpm, tpm = tonumber(ARGV[2]), tonumber(ARGV[3])
local per_day, per_month, concurrency = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local reserve, router, ledgered = tonumber(ARGV[9]), ARGV[10], tonumber(ARGV[11])
local second = math.floor(now / 1000)

-- A budget's total missing from the cache: the router rebuilds it from the ledger first.
if ledgered == 1 and ((per_day > 0 and redis.call('EXISTS', KEYS[3]) == 0) or
                      (per_month > 0 and redis.call('EXISTS', KEYS[4]) == 0)) then
  return {'ledger'}
end

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

-- Places in flight whose hold ran out (their router died) give their reservations back.
for _, gone in ipairs(redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', now)) do
  redis.call('HDEL', KEYS[6], gone)
end
redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', now)
local inflight = redis.call('ZCARD', KEYS[5])
local reserved = 0
for _, n in ipairs(redis.call('HVALS', KEYS[6])) do reserved = reserved + tonumber(n) end

local day = tonumber(redis.call('GET', KEYS[3]) or '0')
local month = tonumber(redis.call('GET', KEYS[4]) or '0')

local refused = ''
if rpm > 0 and requests >= rpm then refused = 'requests'
elseif tpm > 0 and tokens + reserved >= tpm then refused = 'tokens'
elseif per_day > 0 and day + reserved >= per_day then refused = 'day'
elseif per_month > 0 and month + reserved >= per_month then refused = 'month'
elseif concurrency > 0 and inflight >= concurrency then refused = 'concurrency'
end
if refused == '' then
  redis.call('ZADD', KEYS[1], now, id)
  redis.call('PEXPIRE', KEYS[1], 61000)
  requests = requests + 1
  if requests == 1 then requests_reset = 60000 end
  redis.call('ZADD', KEYS[5], hold_until, id)
  redis.call('PEXPIRE', KEYS[5], hold_until - now + 60000)  -- Redis's clock may differ
  inflight = inflight + 1
  if reserve > 0 then
    redis.call('HSET', KEYS[6], id, reserve)
    redis.call('PEXPIRE', KEYS[6], hold_until - now + 60000)
  end
end
redis.call('ZADD', KEYS[7], now, router)
redis.call('ZREMRANGEBYSCORE', KEYS[7], '-inf', now - ARGV[12] * 1000)
redis.call('PEXPIRE', KEYS[7], ARGV[12] * 1000)
return {refused, requests, tokens + reserved, day, month, inflight,
        math.floor(requests_reset), math.floor(tokens_reset), reserved,
        redis.call('ZCARD', KEYS[7])}
"""

SETTLE = """
local tokens = tonumber(ARGV[2])
redis.call('HDEL', KEYS[5], ARGV[3])
redis.call('ZREM', KEYS[4], ARGV[3])
if tokens > 0 then
  redis.call('HINCRBY', KEYS[1], ARGV[1], tokens)
  redis.call('EXPIRE', KEYS[1], 61)
  -- A budget's total that went missing meanwhile is left for the ledger to rebuild: an
  -- increment alone would pass for the whole day's.
  if ARGV[6] == '0' or redis.call('EXISTS', KEYS[2]) == 1 then
    redis.call('INCRBY', KEYS[2], tokens)
    redis.call('EXPIRE', KEYS[2], ARGV[4])
  end
  if ARGV[7] == '0' or redis.call('EXISTS', KEYS[3]) == 1 then
    redis.call('INCRBY', KEYS[3], tokens)
    redis.call('EXPIRE', KEYS[3], ARGV[5])
  end
end
return 1
"""

# A day's and month's totals raised to the ledger's, never lowered (routers' charges that
# the ledger has not received yet are in Redis only); first, what this router spent alone
# while Redis did not answer is added where Redis still holds a total (its charges failed,
# so they are not there), since the ledger lags a second. -1: the ledger did not answer.
MERGE = """
for i = 1, 2 do
  local spent = tonumber(ARGV[i])
  if spent > 0 and redis.call('EXISTS', KEYS[i]) == 1 then
    redis.call('INCRBY', KEYS[i], spent)
    redis.call('EXPIRE', KEYS[i], ARGV[i + 4])
  end
  local ledger = tonumber(ARGV[i + 2])
  local cached = tonumber(redis.call('GET', KEYS[i]) or '-1')
  if ledger >= 0 and cached < ledger then
    redis.call('SET', KEYS[i], ledger, 'EX', ARGV[i + 4])
  end
end
return 1
"""


# An admission given back: a request that one subject admitted and the next refused (the
# key admitted it, its team did not) leaves no trace on the first's counters.
RELEASE = """
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
return 1
"""


def as_text(value: Any) -> str:
    """A script's reply, as text (Redis answers bytes)."""
    return value.decode() if isinstance(value, bytes) else str(value)


class Tally(NamedTuple):
    """A key's counters as one admission found them (after counting it, if admitted)."""

    refused: str  # "" admitted; else the limit reached: requests, tokens, day, month, concurrency
    requests: int  # in the last minute
    tokens: int  # in the last minute, and reserved
    day: int  # tokens this UTC day (settled)
    month: int  # tokens this UTC month (settled)
    inflight: int
    requests_reset_ms: int  # until the oldest request of the minute leaves it
    tokens_reset_ms: int  # until the tokens of the minute are under the limit again
    reserved: int = 0  # tokens reserved for the key's requests in flight
    routers: int = 1  # routers that admitted the key lately (they share its budget)


class LocalCounters:
    """The scripts' rules in one process's memory, for while Redis does not answer.

    Day and month budgets are not fresh: ``base`` holds a key's totals when Redis was last
    heard (or the ledger's), ``totals`` what this router spent since, and each router
    spends its share of what was left: ``base + routers * spent`` is held to the budget.
    """

    def __init__(self) -> None:
        self.requests: dict[str, dict[str, float]] = {}
        self.tokens: dict[str, dict[int, int]] = {}
        self.totals: dict[str, int] = {}
        self.inflight: dict[str, dict[str, float]] = {}
        self.reserved: dict[str, dict[str, int]] = {}
        self.base: dict[str, int] = {}  # a day's or month's counter: its total when last known
        self.sharers: dict[str, int] = {}  # a key's prefix: how many routers share it
        self.charged: set[str] = set()  # prefixes charged here since Redis was last heard
        self.stale: set[str] = set()  # counters in ``base`` to read from the ledger again

    def known(self, keys: CounterKeys) -> bool:
        return all(k in self.base and k not in self.stale for k in (keys.day, keys.month))

    def learn(self, key_prefix: str, keys: CounterKeys, day: int, month: int,
              routers: int) -> None:  # fmt: skip
        self.base[keys.day], self.base[keys.month] = day, month
        self.stale.difference_update((keys.day, keys.month))
        self.sharers[key_prefix] = max(1, routers)

    def outage_began(self) -> None:
        """What Redis said last may be old: read each budget from the ledger once more."""
        self.stale = set(self.base)

    def forget_spent(self) -> None:
        """Redis answers again and holds what was spent here (added to its totals)."""
        self.totals.clear()
        self.charged.clear()

    def admit(
        self, keys: CounterKeys, limits: Limits, now: float, request_id: str,
        reserve: int = 0, key_prefix: str = "",
    ) -> Tally:  # fmt: skip
        requests = self.requests.setdefault(keys.requests, {})
        for old in [r for r, at in requests.items() if at <= now - 60]:
            del requests[old]
        second = int(now)
        buckets = self.tokens.setdefault(keys.tokens, {})
        for past in [s for s in buckets if s <= second - 60]:
            del buckets[past]
        inflight = self.inflight.setdefault(keys.inflight, {})
        reserved = self.reserved.setdefault(keys.reserved, {})
        for old in [r for r, until in inflight.items() if until <= now]:
            del inflight[old]
            reserved.pop(old, None)
        held = sum(reserved.values())
        tokens = sum(buckets.values()) + held
        routers = self.sharers.get(key_prefix, 1)
        spent_day = self.totals.get(keys.day, 0) + held
        spent_month = self.totals.get(keys.month, 0) + held
        day = self.base.get(keys.day, 0) + routers * spent_day
        month = self.base.get(keys.month, 0) + routers * spent_month
        refused = _refused(limits, len(requests), tokens, day, month, len(inflight))
        if not refused:
            requests[request_id] = now
            inflight[request_id] = now + INFLIGHT_HOLD_SECONDS
            if reserve:
                reserved[request_id] = reserve
        oldest = min(requests.values(), default=now)
        tokens_reset, left = 0, tokens
        for bucket_second, count in sorted(buckets.items()):
            left -= count
            tokens_reset = (bucket_second + 60 - second) * 1000
            if not limits.tokens_per_minute or left < limits.tokens_per_minute:
                break
        return Tally(
            refused, len(requests), tokens, day, month, len(inflight),
            int((oldest + 60 - now) * 1000), tokens_reset, held, routers,
        )  # fmt: skip

    def release(self, keys: CounterKeys, request_id: str) -> None:
        """RELEASE's rules: the admission leaves no trace."""
        self.requests.get(keys.requests, {}).pop(request_id, None)
        self.inflight.get(keys.inflight, {}).pop(request_id, None)
        self.reserved.get(keys.reserved, {}).pop(request_id, None)

    def charge(self, keys: CounterKeys, now: float, request_id: str, tokens: int,
               key_prefix: str = "") -> None:  # fmt: skip
        if tokens > 0:
            buckets = self.tokens.setdefault(keys.tokens, {})
            buckets[int(now)] = buckets.get(int(now), 0) + tokens
            for total in (keys.day, keys.month):
                self.totals[total] = self.totals.get(total, 0) + tokens
            self.charged.add(key_prefix)
        self.inflight.get(keys.inflight, {}).pop(request_id, None)
        self.reserved.get(keys.reserved, {}).pop(request_id, None)


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
