"""Places in flight taken in blocks: a key (or team) whose only limit is its cap on
requests in flight is admitted without a Redis round trip per request.

Counting each request's place in Redis (counters.py's ADMIT and SETTLE) was the largest
part of the router's CPU per request, and a round trip on each request's path. A cap alone
needs nothing else counted per request, so a router takes the key's places a block at a
time: LEASE adds the block's members to the key's in-flight set, the set ADMIT counts, so
routers that lease and routers that count per request hold one cap together. Requests take
places from the block in memory, and an answer gives its place back to it; the next block
is asked for when it runs out, and refused once the set is full.

What changes: the cap still holds exactly, but a place may sit spare in one router while
another is refused. Every TICK_SECONDS a router keeps what its requests took at most
during the last tick and one block more, and gives the rest back (all of it after a tick
without requests): a router's share follows what it served a moment ago. Giving back at
each answer instead (down to a block or two) made a busy router lease and give back
blocks all the time, as its requests in flight rose and fell. A block is a 32nd of the cap
(at most MOST_BLOCK); caps under LEASE_FROM are counted per request, where a block would
be a large share of them. Leased places are held like a request's: renewed while the
router runs (limits.py), running out INFLIGHT_HOLD_SECONDS after it died, given back when
it stops.

Like the limits' other counters, these are shared only while Redis answers; limits.py
counts alone meanwhile.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from protocol.rate_limits import INFLIGHT_HOLD_SECONDS, CounterKeys, Limits, counter_keys
from router.intake.counters import as_text
from router.intake.limited import Admission, Subject, has_budget

# Caps this big and over are leased; under it, each request is counted in Redis.
LEASE_FROM = 32
# A block is cap // BLOCK_SHARE places, at most MOST_BLOCK.
BLOCK_SHARE = 32
MOST_BLOCK = 8
# How often a router gives back the spare places its requests did not need lately.
TICK_SECONDS = 0.5

# KEYS: in-flight set, reservations, day's and month's totals; ARGV: now (ms), hold until
# (ms), cap, the members wanted. Adds members while the set is under the cap; returns the
# set's size and the members added. A place whose hold ran out (its router died) is
# dropped with its reservation, as ADMIT drops them. Nothing counts a leasing key's tokens
# in Redis, so totals of an earlier budget are dropped: a budget set again is rebuilt from
# the ledger (limits.py), not from a total that stopped counting.
LEASE = """
redis.call('DEL', KEYS[3], KEYS[4])
local now, hold_until, cap = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
for _, gone in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)) do
  redis.call('HDEL', KEYS[2], gone)
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local inflight = redis.call('ZCARD', KEYS[1])
local granted = {inflight}
for i = 4, #ARGV do
  if inflight >= cap then break end
  redis.call('ZADD', KEYS[1], hold_until, ARGV[i])
  inflight = inflight + 1
  granted[1] = inflight
  granted[#granted + 1] = ARGV[i]
end
if #granted > 1 then redis.call('PEXPIRE', KEYS[1], hold_until - now + 60000) end
return granted
"""

# KEYS: in-flight set; ARGV: the members given back.
GIVE_BACK = """
return redis.call('ZREM', KEYS[1], unpack(ARGV))
"""

# Runs a script as limits.py's batch does: (script, keys, args) -> its reply.
RunScript = Callable[[str, list[str], list[Any]], Awaitable[Any]]


def leased(limits: Limits) -> bool:
    """Whether a subject with ``limits`` takes its places in blocks: a cap of LEASE_FROM
    or more, and nothing else counted per request."""
    return (limits.concurrency or 0) >= LEASE_FROM and not (
        limits.requests_per_minute or limits.tokens_per_minute or has_budget(limits)
    )


def block_size(cap: int) -> int:
    return max(1, min(MOST_BLOCK, cap // BLOCK_SHARE))


@dataclass
class Block:
    """The places this router holds of one key's cap."""

    keys: CounterKeys
    spare: list[str] = field(default_factory=list)  # held, taken by no request
    held: set[str] = field(default_factory=set)  # every place held, spare or taken
    size: int = 1  # a block of the key's cap, as it was last asked for
    peak: int = 0  # the most places taken at once since the last tick
    # One lease on its way at a time, for as many places as requests wait: 64 requests
    # arriving together would otherwise each ask for a block, and most be refused while
    # the blocks granted to the first sat spare.
    leasing: asyncio.Lock = field(default_factory=asyncio.Lock)
    waiting: int = 0

    @property
    def taken(self) -> int:
        """Places its requests hold now."""
        return len(self.held) - len(self.spare)


@dataclass
class LeasedPlaces:
    """One router's blocks of places, by the key's in-flight set."""

    router_id: str
    blocks: dict[str, Block] = field(default_factory=dict)
    _names: itertools.count = field(default_factory=itertools.count)

    async def take(
        self, keys: CounterKeys, cap: int, now: float, run: RunScript
    ) -> tuple[str | None, int]:
        """A place for a request (its name), or None when the cap is full; and how many
        places the fleet holds, as far as this router knows (for the refusal)."""
        block = self.blocks.get(keys.inflight)
        if block is None:
            block = self.blocks[keys.inflight] = Block(keys)
        block.size = block_size(cap)
        while not block.spare:
            block.waiting += 1
            async with block.leasing:
                block.waiting -= 1
                if block.spare:  # the lease this one waited for brought enough
                    break
                count = max(block.size, block.waiting + 1)
                wanted = [f"lease:{self.router_id}:{next(self._names)}" for _ in range(count)]
                reply = await run(LEASE, [keys.inflight, keys.reserved, keys.day, keys.month],
                                  [int(now * 1000), int((now + INFLIGHT_HOLD_SECONDS) * 1000),
                                   cap, *wanted])  # fmt: skip
                granted = [as_text(member) for member in reply[1:]]
                block.held.update(granted)
                block.spare += granted
                if not granted:
                    return None, int(reply[0])
        place = block.spare.pop()
        block.peak = max(block.peak, block.taken)
        return place, block.taken

    def admit_now(self, subjects: list[Subject], now: float) -> list[Admission] | None:
        """A place of each subject's spare ones, or None (and none taken) unless each has
        caps alone and a place spare: then limits.py's ``admit``, which may lease a block."""
        if not all(leased(subject.limits) for subject in subjects):
            return None
        keys = [counter_keys(subject.counted_as, now) for subject in subjects]
        blocks = [self.blocks.get(counted.inflight) for counted in keys]
        if not all(block is not None and block.spare for block in blocks):
            return None
        admitted = []
        for block, counted, subject in zip(blocks, keys, subjects, strict=True):
            assert block is not None
            admitted.append(Admission(block.spare.pop(), counted, [], True, subject.limits,
                                      leased=True))  # fmt: skip
            block.peak = max(block.peak, block.taken)
        return admitted

    def put_back(self, keys: CounterKeys, place: str) -> None:
        """An answered request's place, spare again (for the next, until the tick)."""
        block = self.blocks.get(keys.inflight)
        if block is not None and place in block.held:  # else given back: the router stops
            block.spare.append(place)

    async def tick(self, run: RunScript) -> None:
        """Every TICK_SECONDS: of each key's spare places, those its requests did not take
        since the last tick (and a block more) go back to Redis."""
        for block in list(self.blocks.values()):
            keep = block.peak - block.taken + (block.size if block.peak else 0)
            block.peak = block.taken
            if len(block.spare) > keep:
                await self._give_back(block, len(block.spare) - keep, run)
            if not (block.held or block.waiting or block.leasing.locked()):
                del self.blocks[block.keys.inflight]

    async def give_back_all(self, run: RunScript) -> None:
        """Every place held, taken or not: the router stops."""
        for block in list(self.blocks.values()):
            block.spare = list(block.held)
            await self._give_back(block, len(block.spare), run)
        self.blocks.clear()

    def held(self) -> list[tuple[str, str]]:
        """Every place held, as (in-flight set, place): their holds are renewed."""
        return [(counter, place) for counter, block in self.blocks.items() for place in block.held]

    async def _give_back(self, block: Block, count: int, run: RunScript) -> None:
        going, block.spare = block.spare[:count], block.spare[count:]
        block.held.difference_update(going)
        if going:
            await run(GIVE_BACK, [block.keys.inflight], going)
