"""Where requests wait for a replica: at zero replicas, until one has started, and while
every replica is at its concurrency limit, until one is free.

One room per model (``WaitingRoom``), in one router process, made the first time a request
of that model has to wait (``WaitingRooms``). Waiters are served by priority (high, normal,
low), first come first served within one; a full room turns away the lowest: a newcomer
that outranks the last waiter takes its place, and the waiter gets the 429. A client that
hangs up while it waits gives up its place.
"""

from __future__ import annotations

import asyncio
import functools
import heapq
import itertools
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from router.balance.balancer import Balancer
from router.errors import RouterError, unavailable
from router.table.keys import Caller
from router.table.routes import ModelRoute, RoutingTable

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


class WaitingRooms:
    """Every model's waiting room, and when a replica of a model can take one more request."""

    def __init__(
        self, balancer: Balancer, table: Callable[[], RoutingTable], size: int, patience: float
    ) -> None:
        """``table`` gives the routing table in use now; ``size`` is a room's places
        (LLMGW_ROUTER_QUEUE_SIZE), ``patience`` how long a request waits at most
        (LLMGW_ROUTER_COLD_START_TIMEOUT)."""
        self.balancer = balancer
        self.table = table
        self.size = size
        self.patience = patience
        self.rooms: dict[str, WaitingRoom] = {}  # by model

    def can_take(self, name: str) -> bool:
        """Whether a replica of model ``name`` could take one more request now."""
        route = self.table().routes.get(name)
        if route is None or not route.endpoints:
            return False
        limit = route.concurrency
        return not limit or any(self.balancer.inflight(e.replica) < limit for e in route.endpoints)

    async def wait_for_replica(
        self, route: ModelRoute, caller: Caller, receive: Callable[[], Awaitable[Any]] | None
    ) -> ModelRoute | None:
        """The route once a replica can take the request: at once, or after waiting for
        one to start (an autoscaled model at zero) or to free a place (at concurrency);
        None when the client left while it waited (``receive`` None: not watched)."""
        if route.endpoints and not route.concurrency:
            return route
        room = self.rooms.get(route.name)
        if room is None:
            room = self.rooms[route.name] = WaitingRoom(route.name, self.size)
        deadline = time.monotonic() + self.patience
        # A client that leaves gives up its place, and no replica is started or used for it.
        leaving = asyncio.ensure_future(
            _disconnect(receive) if receive is not None else asyncio.Event().wait()
        )
        try:
            while True:
                patience = max(deadline - time.monotonic(), 0.0)
                waiting = asyncio.ensure_future(
                    room.wait(caller.priority, lambda: self.can_take(route.name), patience)
                )
                try:
                    await asyncio.wait({waiting, leaving}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    if not waiting.done():
                        waiting.cancel()
                if not waiting.done() or waiting.cancelled():
                    return None
                self._outcome(route, waiting)  # the room's 429 or 503, if it gave one
                # Checked again here, where nothing runs between this check and the pick:
                # another request woken at the same moment may have taken the place.
                if self.can_take(route.name):
                    return self.table().routes.get(route.name, route)
        finally:
            if not leaving.done():
                leaving.cancel()

    def _outcome(self, route: ModelRoute, waiting: asyncio.Future) -> None:
        """Raise the room's refusal, if it gave one; a 503 for a model whose replicas are
        all taken out by their breakers says that instead (their requests hang on a dead
        node until they time out, and hold every place meanwhile)."""
        try:
            waiting.result()
        except RouterError as refused:
            outage = self.balancer.outage(route.endpoints) if refused.status == 503 else None
            if outage is None:
                raise
            raise unavailable(outage.sentence(route.name), outage.retry_after) from None

    def place_freed(self, name: str) -> None:
        """A request of model ``name`` ended: its place on a replica may take the next waiter."""
        room = self.rooms.get(name)
        if room is not None:
            room.notify(lambda: self.can_take(name))

    def table_changed(self) -> None:
        """A new table is in use: a replica may have become ready for any waiting model."""
        for name, room in self.rooms.items():
            room.notify(functools.partial(self.can_take, name))


async def _disconnect(receive: Callable[[], Awaitable[Any]]) -> None:
    """Return once the client has hung up (the body was read whole before this)."""
    while (await receive())["type"] != "http.disconnect":
        pass
