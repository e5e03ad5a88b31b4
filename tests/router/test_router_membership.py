"""A router tells the fleet where it is: its addresses in every in-flight report (each
node's walls admit them to engines' HTTP ports), and that it left, as it stops."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import redis
from django.conf import settings

from core.addresses import own_addresses
from protocol.members import LEFT_KEY_PREFIX
from protocol.routing import INFLIGHT_KEY_PREFIX
from router.balance.inflight import report_inflight
from router.traffic import Traffic


def test_a_router_reports_its_addresses_and_says_it_left_as_it_stops():
    client = redis.Redis.from_url(settings.REDIS_URL)
    before = set(client.scan_iter(INFLIGHT_KEY_PREFIX + "*"))
    stub = SimpleNamespace(
        table=SimpleNamespace(routes={}),
        balancer=SimpleNamespace(health={}, inflight=lambda _replica: 0, failing=lambda: []),
        rooms={},
        source=SimpleNamespace(redis_url=settings.REDIS_URL),
        metrics=SimpleNamespace(traffic=Traffic()),
    )

    async def run() -> list[tuple[bytes, dict]]:
        reporting = asyncio.create_task(report_inflight(stub, interval=0.05))
        try:
            for _ in range(200):
                mine = set(client.scan_iter(INFLIGHT_KEY_PREFIX + "*")) - before
                if mine:
                    return [(key, json.loads(client.get(key) or b"{}")) for key in mine]
                await asyncio.sleep(0.05)
            return []
        finally:
            reporting.cancel()
            await asyncio.gather(reporting, return_exceptions=True)

    [(key, report)] = asyncio.run(run())
    assert report["addresses"] == own_addresses()
    me = key.decode().removeprefix(INFLIGHT_KEY_PREFIX)
    left = f"{LEFT_KEY_PREFIX}router:{me}"
    try:
        assert client.get(key) is None  # gone with the router
        assert client.get(left) is not None  # and the leader hears that it left
    finally:
        client.delete(left)


def test_the_addresses_a_router_reports_are_its_interfaces_or_what_the_operator_says():
    assert "127.0.0.1" not in own_addresses({})  # no other host sees loopback
    assert own_addresses({"LLMGW_CALLER_ADDRESSES": "203.0.113.7, 203.0.113.8"}) == [
        "203.0.113.7", "203.0.113.8"
    ]  # fmt: skip
    assert json.dumps(own_addresses({}))  # plain strings, as the report carries them
