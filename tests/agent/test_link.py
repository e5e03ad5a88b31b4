"""The agent's link against real websocket servers: failover, rejoin, refusal, stop."""

from __future__ import annotations

import asyncio
import logging
import random

import pytest

from agent_worker import link as link_module
from agent_worker.link import AgentLink, LinkCallbacks, agent_url, backoff_delay
from tests.agent.fake_control_plane import Canned, FakeControlPlane
from tests.support.polling import wait_until_async


def make_link(servers, heartbeat_interval=0.05) -> AgentLink:
    register, heartbeat = Canned(type="register"), Canned(type="heartbeat")
    return AgentLink(
        servers, "node01", "token",
        LinkCallbacks(register=lambda: register, heartbeat=lambda: heartbeat),
        heartbeat_interval=heartbeat_interval,
    )  # fmt: skip


@pytest.fixture
def no_backoff(monkeypatch):
    """Record backoff requests instead of sleeping through them."""
    waits: list[float] = []

    def record(rounds, rng=None):
        waits.append(rounds)
        return 0.05

    monkeypatch.setattr(link_module, "backoff_delay", record)
    return waits


async def link_until_status_arrives(link, plane, shard_id: str = "s1"):
    """Point ``link`` at ``plane``, run it until the status of ``shard_id`` has arrived, stop
    both, and return the plane with everything it received in order."""
    await plane.start()
    link.servers = [plane.url]
    task = asyncio.create_task(link.run())
    await wait_until_async(lambda: any(m.get("shard_id") == shard_id for m in plane.received))
    link.stop()
    await asyncio.wait_for(task, 5)
    await plane.stop()
    return plane


def test_a_refusing_first_address_fails_over_to_the_second_without_backoff(no_backoff, caplog):
    async def scenario():
        standby = await FakeControlPlane(refuse="standby; the leader is cp2").start()
        leader = await FakeControlPlane().start()
        link = make_link([standby.url, leader.url])
        task = asyncio.create_task(link.run())
        await wait_until_async(lambda: leader.links == 1)
        link.stop()
        await asyncio.wait_for(task, 5)
        await standby.stop()
        await leader.stop()
        return standby

    with caplog.at_level(logging.WARNING, logger="llmgw.agent.link"):
        standby = asyncio.run(scenario())
    assert no_backoff == []
    assert standby.received == [{"type": "register"}]
    assert "refused the link: standby; the leader is cp2" in caplog.text


def test_backoff_only_after_every_address_failed(no_backoff):
    async def scenario():
        refusing = await FakeControlPlane(refuse="no").start()
        link = make_link([refusing.url, "ws://127.0.0.1:9"])
        task = asyncio.create_task(link.run())
        await wait_until_async(lambda: len(no_backoff) >= 2)
        link.stop()
        await asyncio.wait_for(task, 5)
        await refusing.stop()
        return refusing

    refusing = asyncio.run(scenario())
    # One backoff per round of two failures, never between the two addresses.
    assert no_backoff[:2] == [1, 2]
    assert len(refusing.received) in (len(no_backoff), len(no_backoff) + 1)


def test_a_control_plane_that_restarts_is_rejoined(no_backoff):
    async def scenario():
        first = await FakeControlPlane().start()
        link = make_link([first.url])
        task = asyncio.create_task(link.run())
        await wait_until_async(lambda: first.links == 1)
        port = first.port
        await first.stop()
        second = await FakeControlPlane().start(port)
        await wait_until_async(lambda: second.links == 1)
        await wait_until_async(lambda: any(m["type"] == "heartbeat" for m in second.received))
        link.stop()
        await asyncio.wait_for(task, 5)
        await second.stop()
        return link

    link = asyncio.run(scenario())
    assert link.sessions == 2


def test_a_control_plane_that_links_then_drops_is_relinked_with_growing_backoff(no_backoff):
    async def scenario():
        dropping = await FakeControlPlane(drop=True).start()
        link = make_link([dropping.url])
        task = asyncio.create_task(link.run())
        await wait_until_async(lambda: dropping.links >= 4)
        link.stop()
        await asyncio.wait_for(task, 5)
        await dropping.stop()

    asyncio.run(scenario())
    # Each short session is a failed round: the backoff grows instead of resetting.
    assert no_backoff[:3] == [1, 2, 3]


def test_stop_ends_a_linked_session_promptly():
    async def scenario():
        plane = await FakeControlPlane().start()
        link = make_link([plane.url], heartbeat_interval=60)
        task = asyncio.create_task(link.run())
        await wait_until_async(lambda: plane.links == 1)
        link.stop()
        # Bounded: a hung read would make this time out rather than return.
        await asyncio.wait_for(task, 5)
        await plane.stop()
        return task

    assert asyncio.run(scenario()).done()


def test_messages_queued_while_linked_reach_the_control_plane(no_backoff):
    async def scenario():
        plane = await FakeControlPlane().start()
        link = make_link([plane.url], heartbeat_interval=60)
        task = asyncio.create_task(link.run())
        await wait_until_async(lambda: plane.links == 1)
        await asyncio.to_thread(link.send, Canned(type="shard_status", shard_id="s1"))
        await wait_until_async(lambda: any(m.get("shard_id") == "s1" for m in plane.received))
        link.stop()
        await asyncio.wait_for(task, 5)
        await plane.stop()

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("server", "url"),
    [
        ("http://cp:8000", "ws://cp:8000/agent/"),
        ("https://cp", "wss://cp/agent/"),
        ("wss://cp:8443/", "wss://cp:8443/agent/"),
        ("cp:8000", "ws://cp:8000/agent/"),
    ],
)
def test_agent_url(server, url):
    assert agent_url(server) == url


def test_backoff_grows_to_a_ceiling_with_jitter():
    rng = random.Random(1)
    delays = [backoff_delay(n, rng) for n in range(1, 12)]
    assert delays[0] <= 1.0
    assert delays[-1] >= 7.5


def test_a_healed_node_tries_again_well_before_it_would_be_lost():
    # A node cut off for 40 s must not then sleep past the 60 s after which it is lost.
    rng = random.Random(3)
    assert max(backoff_delay(n, rng) for n in range(1, 40) for _ in range(20)) <= 15.0


def test_backoff_is_jittered_so_a_fleet_never_reconnects_in_step():
    # Twenty agents that lost the control plane together, each with its own random source.
    delays = [backoff_delay(4, random.Random(agent)) for agent in range(20)]
    assert len(set(delays)) == 20
    assert all(4.0 <= d <= 8.0 for d in delays)
    assert max(delays) - min(delays) > 2.0  # spread over the round's range, not bunched
    # One agent at the ceiling does not settle into a fixed period either.
    rng = random.Random(7)
    assert len({backoff_delay(30, rng) for _ in range(5)}) == 5


def test_events_sent_while_unlinked_go_out_right_after_the_register(no_backoff):
    # An engine may turn ready between building a register and linking; that
    # transition must reach the control plane, after the register it follows.
    async def scenario():
        plane = FakeControlPlane()
        link = make_link(["ws://127.0.0.1:9"], heartbeat_interval=60)
        await asyncio.to_thread(link.send, Canned(type="shard_status", shard_id="s1"))
        return await link_until_status_arrives(link, plane)

    plane = asyncio.run(scenario())
    assert [m["type"] for m in plane.received][:2] == ["register", "shard_status"]


def test_a_newer_statement_replaces_an_older_one_not_yet_sent(no_backoff):
    # A listing of the weights is the whole truth: an older one sent after a newer one
    # would leave the control plane with the older until the next change.
    async def scenario():
        plane = FakeControlPlane()
        link = make_link(["ws://127.0.0.1:9"], heartbeat_interval=60)
        for n in (1, 2):
            await asyncio.to_thread(link.send_latest, "weights", Canned(type="weights", n=n))
        await asyncio.to_thread(link.send_latest, "engines", Canned(type="engines", n=1))
        await asyncio.to_thread(link.forget, "engines")  # a register will say them anew
        link.send(Canned(type="shard_status", shard_id="s1"))
        return await link_until_status_arrives(link, plane)

    plane = asyncio.run(scenario())
    assert plane.received == [
        {"type": "register"},
        {"type": "weights", "n": 2},
        {"type": "shard_status", "shard_id": "s1"},
    ]


def test_a_register_asked_for_while_linked_goes_on_the_same_link(no_backoff):
    registers = []

    def register():
        registers.append(1)
        return Canned(type="register", n=len(registers))

    async def scenario():
        plane = await FakeControlPlane().start()
        link = AgentLink([plane.url], "node01", "token", LinkCallbacks(
            register=register, heartbeat=lambda: Canned(type="heartbeat")),
            heartbeat_interval=60)  # fmt: skip
        task = asyncio.create_task(link.run())
        await wait_until_async(lambda: plane.links == 1)
        await asyncio.to_thread(link.request_register)
        await wait_until_async(lambda: len(plane.received) == 2)
        link.stop()
        await asyncio.wait_for(task, 5)
        await plane.stop()
        return plane, link

    plane, link = asyncio.run(scenario())
    assert plane.received == [{"type": "register", "n": 1}, {"type": "register", "n": 2}]
    assert (plane.links, link.sessions) == (1, 1)


def test_the_epoch_a_control_plane_names_on_linking_reaches_the_agent(no_backoff):
    told: list[int] = []

    async def scenario():
        plane = await FakeControlPlane(epoch=7).start()
        register, heartbeat = Canned(type="register"), Canned(type="heartbeat")
        callbacks = LinkCallbacks(register=lambda: register, heartbeat=lambda: heartbeat,
                                  epoch=told.append)  # fmt: skip
        link = AgentLink([plane.url], "node01", "token", callbacks, heartbeat_interval=60)
        task = asyncio.create_task(link.run())
        await wait_until_async(lambda: told)
        link.stop()
        await asyncio.wait_for(task, 5)
        await plane.stop()

    asyncio.run(scenario())
    assert told == [7]
