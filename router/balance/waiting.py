"""Where requests wait for a replica: at zero replicas, until one has started, and while
every replica is at its concurrency limit, until one is free.

One room per model, in one router process. Waiters are served by priority (high, normal,
low), first come first served within one; a full room turns away the lowest: a newcomer
that outranks the last waiter takes its place, and the waiter gets the 429.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from router.errors import RouterError

PRIORITY_RANK = {"high": 0, "normal": 1, "low": 2}


@dataclass(order=True)
class _Waiter:
    rank: int
    seq: int
    future: asyncio.Future = field(compare=False)


class WaitingRoom:
    """The requests of one model that wait, and the rule that lets them in."""

    def __init__(self, model: str, size: int) -> None:
        self.model = model
        self.size = size
        self._heap: list[_Waiter] = []
        self._seq = itertools.count()

    def __len__(self) -> int:
        return sum(1 for w in self._heap if not w.future.done())

    async def wait(self, priority: str, ready: Callable[[], bool], patience: float) -> None:
        """Return once ``ready()`` holds for this waiter's turn; raise the 429 or 503 to
        answer when the room is full or ``patience`` seconds pass first."""
        if not self._heap and ready():
            return
        waiter = _Waiter(PRIORITY_RANK.get(priority, 1), next(self._seq),
                         asyncio.get_running_loop().create_future())  # fmt: skip
        self._admit(waiter)
        deadline = time.monotonic() + patience
        try:
            while True:
                self._wake_first(ready)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise self._timed_out(patience)
                try:
                    await asyncio.wait_for(asyncio.shield(waiter.future), remaining)
                except TimeoutError:
                    raise self._timed_out(patience) from None
                waiter.future.result()  # the eviction's 429, if it was turned away
                if ready():
                    return
                waiter.future = asyncio.get_running_loop().create_future()
                heapq.heappush(self._heap, waiter)
        finally:
            if not waiter.future.done():
                waiter.future.cancel()
            self._heap = [w for w in self._heap if w is not waiter]
            heapq.heapify(self._heap)
            self._wake_first(ready)

    def notify(self, ready: Callable[[], bool]) -> None:
        """Something changed (a request finished, the table was reloaded): let the first in."""
        self._wake_first(ready)

    def _admit(self, waiter: _Waiter) -> None:
        live = [w for w in self._heap if not w.future.done()]
        if len(live) >= self.size:
            last = max(live)
            if waiter < last:
                last.future.set_exception(self._full(turned_away=True))
                self._heap.remove(last)
                heapq.heapify(self._heap)
            else:
                raise self._full(turned_away=False)
        heapq.heappush(self._heap, waiter)

    def _wake_first(self, ready: Callable[[], bool]) -> None:
        while self._heap and self._heap[0].future.done():
            heapq.heappop(self._heap)
        if self._heap and ready():
            heapq.heappop(self._heap).future.set_result(None)

    def _full(self, turned_away: bool) -> RouterError:
        why = ("a request of higher priority took its place" if turned_away
               else f"all {self.size} places are taken")  # fmt: skip
        return RouterError(
            429,
            f"Every replica of {self.model} is busy and its queue is full ({why}); "
            "try again shortly.",
            "rate_limit_exceeded",
            "queue_full",
            headers=[(b"retry-after", b"1")],
        )

    def _timed_out(self, timeout: float) -> RouterError:
        return RouterError(
            503,
            f"No replica of {self.model} could take the request within {timeout:.0f} s; "
            "try again shortly.",
            "service_unavailable",
            "no_ready_replica",
            headers=[(b"retry-after", b"5")],
        )
