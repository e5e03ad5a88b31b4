"""Per-key (and per-team) limits as routers enforce them together, and where their
counters live.

Routers admit and charge requests against counters in Redis (``router/intake/limits.py``),
shared by every router process; the control plane reads the same counters to show a
key's usage against its limits (``llmgw_ctl keys show``). Only keys with a limit are
counted, so a key without one costs no Redis round trip per request.
"""

from __future__ import annotations

import calendar
import functools
import time
from dataclasses import asdict, dataclass, fields
from typing import Any, NamedTuple

COUNTER_PREFIX = "llmgw:limits:"
MINUTE = 60
# A request's place in flight (and the tokens reserved for it) is held this long, and its
# router renews the hold every INFLIGHT_RENEW_SECONDS while it runs: a router that died
# holding some blocks the key for two minutes at most.
INFLIGHT_HOLD_SECONDS = 120
INFLIGHT_RENEW_SECONDS = 30


@dataclass(frozen=True, slots=True)
class Limits:
    """A key's limits; None is no limit."""

    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None  # prompt and completion together
    tokens_per_day: int | None = None  # calendar day, UTC
    tokens_per_month: int | None = None  # calendar month, UTC
    concurrency: int | None = None  # requests in flight at once

    def __bool__(self) -> bool:  # asked of every request's key: no walk of fields()
        return not (
            self.requests_per_minute is None and self.tokens_per_minute is None
            and self.tokens_per_day is None and self.tokens_per_month is None
            and self.concurrency is None
        )  # fmt: skip

    def as_dict(self) -> dict[str, int]:
        return {name: value for name, value in asdict(self).items() if value is not None}

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> Limits:
        names = {f.name for f in fields(cls)}
        return cls(**{k: int(v) for k, v in (data or {}).items() if k in names and v is not None})


class CounterKeys(NamedTuple):
    """The Redis keys one API key is counted under, for the windows that hold at ``now``."""

    requests: str  # sorted set: request id by arrival time (ms), the last minute
    tokens: str  # hash: tokens by second, the last minute
    day: str  # tokens this UTC day
    month: str  # tokens this UTC month
    inflight: str  # sorted set: request id by the time its hold runs out (ms)
    reserved: str  # hash: request id to the tokens reserved for it until it is settled
    routers: str  # sorted set: the routers that admitted the key lately, by when (ms)

    @property
    def prefix(self) -> str:
        """The key's prefix (or team's counter name), from the braces its counters carry."""
        return self.requests[self.requests.index("{") + 1 : self.requests.index("}")]


def counter_keys(key_prefix: str, now: float) -> CounterKeys:
    return _counter_keys(key_prefix, int(now) // 86400)


@functools.lru_cache(maxsize=4096)  # one admission each request: the same names all day
def _counter_keys(key_prefix: str, day_number: int) -> CounterKeys:
    at = time.gmtime(day_number * 86400)
    day, month = time.strftime("%Y%m%d", at), time.strftime("%Y%m", at)
    # The braces keep one key's counters in one Redis Cluster slot, as scripts need.
    base = f"{COUNTER_PREFIX}{{{key_prefix}}}:"
    return CounterKeys(
        base + "requests", base + "tokens", f"{base}day:{day}", f"{base}month:{month}",
        base + "inflight", base + "reserved", base + "routers",
    )  # fmt: skip


# A team's counters are named for it beside its keys' prefixes, which start "llmgw-": a
# team's budgets hold all its keys together, by the same scripts as a key's (issue 43).
TEAM_COUNTER_START = "team:"


def team_counter_name(team: str) -> str:
    """The name a team's counters go by, where a key's prefix would be."""
    return TEAM_COUNTER_START + team


def counted_team(name: str) -> str:
    """The team whose counters these are; "" for a key's."""
    return name.removeprefix(TEAM_COUNTER_START) if name.startswith(TEAM_COUNTER_START) else ""


def day_ends(now: float) -> float:
    """When the UTC day holding ``now`` ends, as a unix time."""
    return (int(now) // 86400 + 1) * 86400


def day_starts(now: float) -> float:
    """When the UTC day holding ``now`` began, as a unix time."""
    return float(int(now) // 86400 * 86400)


def month_starts(now: float) -> float:
    """When the UTC month holding ``now`` began, as a unix time."""
    year, month = time.gmtime(now)[:2]
    return float(calendar.timegm((year, month, 1, 0, 0, 0)))


def month_ends(now: float) -> float:
    """When the UTC month holding ``now`` ends, as a unix time."""
    year, month = time.gmtime(now)[:2]
    year, month = (year + 1, 1) if month == 12 else (year, month + 1)
    return float(calendar.timegm((year, month, 1, 0, 0, 0)))
