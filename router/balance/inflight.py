"""Tell the control plane what this router routes and what it still carries, every second,
and add what it served since the last report to the model page's traffic (traffic.py).

A rolling restart takes a replica out of the routing table and stops it once no router
carries a request to it any more; only the routers know that. Each router process
writes one small JSON value to Redis (``INFLIGHT_KEY_PREFIX`` + its id) with a short
expiry, so a router that stops also stops counting. Off the request path: the report is
built from the balancer's counters, which requests keep anyway.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import time
import uuid
from collections.abc import Mapping
from typing import Any, Protocol

from core.addresses import own_addresses
from protocol.members import LEFT_KEY_PREFIX, LEFT_TTL, ROUTER
from protocol.routing import INFLIGHT_KEY_PREFIX, INFLIGHT_REPORT_SECONDS, INFLIGHT_REPORT_TTL
from router.balance.balancer import Balancer
from router.metrics import RouterMetrics
from router.table.routes import RoutingTable
from router.traffic import add_traffic, with_load

logger = logging.getLogger(__name__)


class _Reporting(Protocol):
    balancer: Balancer
    metrics: RouterMetrics
    source: Any  # its redis_url is known once the database source has loaded

    @property
    def table(self) -> RoutingTable: ...  # the one in use

    @property
    def rooms(self) -> Mapping[str, Any]: ...  # model -> its WaitingRoom


def inflight_report(
    table: RoutingTable, balancer: Balancer, now: float, queued: Mapping[str, int] | None = None
) -> dict[str, Any]:
    """What a router says: the replicas its table routes, those carrying requests, those
    its breakers took out (``failing``: a model none of whose replicas answers gets a
    stand-in), and per model the requests in flight and waiting (``queued``, by model),
    which autoscaling follows."""
    routed = sorted({e.replica for route in table.routes.values() for e in route.endpoints})
    inflight = {r: balancer.inflight(r) for r in list(balancer.health) if balancer.inflight(r)}
    queued = dict(queued or {})
    for name, route in table.routes.items():
        if route.parent and queued.get(name):
            # An adapter's replicas are its base's, whose in-flight counts hold its requests
            # already; what waits for it is demand for the base's replicas too.
            queued[route.parent] = queued.get(route.parent, 0) + queued.pop(name)
    models = {}
    for name, route in table.routes.items():
        carried = sum(balancer.inflight(e.replica) for e in route.endpoints)
        if not route.parent and (carried or queued.get(name)):
            models[name] = {"inflight": carried, "queued": queued.get(name, 0)}
    failing = [r for r in balancer.failing() if r in routed]
    return {"at": now, "routed": routed, "inflight": inflight, "failing": failing,
            "models": models}  # fmt: skip


def router_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


async def report_inflight(router: _Reporting, interval: float = INFLIGHT_REPORT_SECONDS) -> None:
    """Write this router's report every ``interval`` seconds until cancelled, with the
    addresses nodes see it connect from (their walls admit those to engines' HTTP ports);
    and that it left, as it stops."""
    import redis.asyncio as aioredis

    me = router_id()
    key = INFLIGHT_KEY_PREFIX + me
    addresses = own_addresses()
    client = None
    complained = False
    try:
        while True:
            url = getattr(router.source, "redis_url", "")
            if url and client is None:
                client = aioredis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
            if client is not None:
                try:
                    queued = {name: len(room) for name, room in router.rooms.items()}
                    report = inflight_report(router.table, router.balancer, time.time(), queued)
                    body = json.dumps({**report, "addresses": addresses})
                    traffic = with_load(router.metrics.traffic.take(), report["models"])
                    await client.set(key, body, ex=INFLIGHT_REPORT_TTL)
                    # A second's traffic lost with Redis costs a chart a dip, nothing more.
                    await add_traffic(client, traffic, report["at"])
                    complained = False
                except Exception as exc:
                    # A drain then waits its whole drain_timeout; requests are not affected.
                    if not complained:
                        logger.warning("in-flight report not written (retrying): %s", exc)
                        complained = True
            await asyncio.sleep(interval)
    finally:
        if client is not None:
            await asyncio.shield(_say_left(client, key, f"{LEFT_KEY_PREFIX}{ROUTER}:{me}"))
            with contextlib.suppress(Exception):
                await client.aclose()


async def _say_left(client, report_key: str, left_key: str, tries: int = 2) -> None:
    """That this router left, and its report gone, in one round trip: the leader walls it
    out of engines at its next pass, rather than a minute after its last report. Tried
    again once (a busy machine's Redis may miss the first within its timeout); said in the
    log when it could not be, since the walls then wait out that minute."""
    for attempt in range(tries):
        try:
            async with client.pipeline(transaction=False) as pipe:
                pipe.set(left_key, str(time.time()), ex=LEFT_TTL)
                pipe.delete(report_key)
                await pipe.execute()
            return
        except Exception as exc:
            if attempt == tries - 1:
                logger.warning("could not say this router left (walls admit it a minute "
                               "more): %s", exc)  # fmt: skip
