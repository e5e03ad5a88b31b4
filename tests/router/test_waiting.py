"""The waiting room: requests wait for a free replica in priority order, a full room turns
away the lowest first, and a wait that outlasts its timeout is a 503."""

from __future__ import annotations

import asyncio

import pytest

from router.balance.waiting import WaitingRoom
from router.errors import RouterError

pytestmark = pytest.mark.asyncio


class Slots:
    """Free places on the replicas, as the balancer would count them."""

    def __init__(self, free: int) -> None:
        self.free = free

    def ready(self) -> bool:
        return self.free > 0

    def take(self) -> None:
        self.free -= 1


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_a_free_replica_lets_a_request_straight_in():
    room, slots = WaitingRoom("gemma", size=4), Slots(1)
    await asyncio.wait_for(room.wait("normal", slots.ready, patience=5), 1)
    assert len(room) == 0


async def test_waiters_are_served_high_first_then_in_arrival_order():
    room, slots = WaitingRoom("gemma", size=10), Slots(0)
    served: list[str] = []

    async def request(name: str, priority: str) -> None:
        await room.wait(priority, slots.ready, patience=30)
        slots.take()
        served.append(name)

    tasks = []
    for name, priority in [("low-1", "low"), ("normal-1", "normal"), ("high-1", "high"),
                           ("normal-2", "normal"), ("high-2", "high")]:  # fmt: skip
        tasks.append(asyncio.create_task(request(name, priority)))
        await settle()
    assert len(room) == 5 and not served
    for _ in range(5):
        slots.free += 1
        room.notify(slots.ready)
        await settle()
    await asyncio.gather(*tasks)
    assert served == ["high-1", "high-2", "normal-1", "normal-2", "low-1"]


async def test_a_full_room_turns_away_the_lowest_first():
    room, slots = WaitingRoom("gemma", size=2), Slots(0)
    low = asyncio.create_task(room.wait("low", slots.ready, patience=30))
    normal = asyncio.create_task(room.wait("normal", slots.ready, patience=30))
    await settle()
    high = asyncio.create_task(room.wait("high", slots.ready, patience=30))
    await settle()
    with pytest.raises(RouterError) as turned_away:
        await low
    assert turned_away.value.status == 429
    assert "a request of higher priority took its place" in turned_away.value.message
    # Another low one finds the room full of better ones and is refused at once.
    with pytest.raises(RouterError, match="all 2 places are taken"):
        await room.wait("low", slots.ready, patience=30)
    slots.free = 2
    room.notify(slots.ready)
    await asyncio.wait_for(asyncio.gather(normal, high), 5)


async def test_a_wait_past_its_timeout_is_a_503_and_leaves_the_room():
    room, slots = WaitingRoom("gemma", size=2), Slots(0)
    with pytest.raises(RouterError) as timed_out:
        await room.wait("normal", slots.ready, patience=0.05)
    assert timed_out.value.status == 503
    assert "No replica of gemma could take the request within 0 s" in timed_out.value.message
    assert len(room) == 0


async def test_a_client_that_leaves_gives_up_its_place():
    room, slots = WaitingRoom("gemma", size=1), Slots(0)
    leaving = asyncio.create_task(room.wait("normal", slots.ready, patience=30))
    await settle()
    leaving.cancel()
    await settle()
    assert len(room) == 0
    staying = asyncio.create_task(room.wait("normal", slots.ready, patience=30))
    await settle()
    slots.free = 1
    room.notify(slots.ready)
    await asyncio.wait_for(staying, 5)


async def test_a_wait_for_replicas_all_taken_out_says_so_and_since_when():
    """A model at its concurrency whose replicas all fail (their requests hang on a dead
    node until they time out): the 503 says they exist and none answers, not only that
    none could take the request."""
    from router.balance.balancer import Balancer
    from router.balance.waiting import WaitingRooms
    from router.table.keys import ANONYMOUS
    from router.table.routes import Endpoint, ModelRoute, RoutingTable

    balancer = Balancer(failure_threshold=1, cooldown=600)
    route = ModelRoute("gemma", endpoints=(Endpoint("r1", "http://a:1", b""),), concurrency=1)
    table = RoutingTable(routes={"gemma": route}, by_name={"gemma": route})
    balancer.started("r1")  # one request holds its one place, hanging
    balancer.started("r1")
    balancer.finished("r1", ok=False)  # and the last one failed: taken out
    rooms = WaitingRooms(balancer, lambda: table, size=10, patience=0.05)
    with pytest.raises(RouterError) as refused:
        await rooms.wait_for_replica(route, ANONYMOUS, None)
    assert refused.value.status == 503 and refused.value.code == "no_ready_replica"
    assert refused.value.message.startswith("1 replica of gemma exists and none answers")
    assert "none has answered since" in refused.value.message
