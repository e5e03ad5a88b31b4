"""Connect to Redis the way one llmgw process does, in a fresh interpreter, and say how
each client fared: ``python -m tests.site.redis_probe control|router|agent``.

Each process reads its Redis URL from the environment when it starts (settings derive the
channel layer and the Celery configuration at import), so only a fresh interpreter shows
what a real one does. Prints one line, ``PROBE {"step": "ok" | "Error: message"}``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

WAIT = 10.0
QUEUE = "llmgw-redis-probe"


def attempt(results: dict[str, str], step: str, fn: Callable[[], Any]) -> bool:
    try:
        fn()
    except Exception as exc:  # the report is the point: any failure, as it reads
        results[step] = f"{type(exc).__name__}: {exc}"
        return False
    results[step] = "ok"
    return True


class Warnings(logging.Handler):
    """What a loop logged instead of raising (the router retries rather than dying)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def celery_steps(app: Any, results: dict[str, str]) -> None:
    """One message through the broker with kombu, and one result through the backend."""

    def broker() -> None:
        with app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, interval_start=0, interval_step=0)
            queue = conn.SimpleQueue(QUEUE)
            try:
                queue.put({"n": 1})
                message = queue.get(timeout=WAIT)
                message.ack()
                assert message.payload == {"n": 1}, message.payload
            finally:
                queue.close()

    def backend() -> None:
        app.backend.client.ping()
        app.backend.store_result("redis-probe", {"n": 2}, "SUCCESS")
        meta = app.backend.get_task_meta("redis-probe")
        assert meta["result"] == {"n": 2}, meta

    attempt(results, "celery_broker", broker)
    attempt(results, "celery_backend", backend)


def control(results: dict[str, str]) -> None:
    import django

    django.setup()
    from channels.layers import get_channel_layer

    from audit.redis import redis_client
    from llmgw_site.celery import app

    attempt(results, "redis_client", lambda: redis_client().ping())

    async def channel_layer() -> None:
        layer = get_channel_layer()
        try:
            channel = await layer.new_channel()
            await layer.group_add("redis-probe", channel)
            await layer.group_send("redis-probe", {"type": "probe.hello", "n": 3})
            message = await asyncio.wait_for(layer.receive(channel), WAIT)
            await layer.group_discard("redis-probe", channel)
            assert message["n"] == 3, message
        finally:
            await layer.close_pools()

    attempt(results, "channel_layer", lambda: asyncio.run(channel_layer()))
    celery_steps(app, results)


def router(results: dict[str, str]) -> None:
    from audit.redis import redis_client
    from core.redis_clients import channel_on
    from protocol.routing import INFLIGHT_KEY_PREFIX, ROUTING_CHANNEL
    from router.balance.inflight import report_inflight
    from router.table.sources import DatabaseSource, Refresher
    from router.traffic import Traffic

    source = DatabaseSource()
    source._setup()  # what the router's first load does: read settings.REDIS_URL
    warnings = Warnings()
    logging.getLogger("router").addHandler(warnings)

    async def notifications() -> None:
        woken = asyncio.Event()
        refresher = Refresher(source, lambda _loaded: None, interval=3600)
        refresher.wake = woken.set
        listening = asyncio.create_task(refresher.listen())
        try:
            await asyncio.wait_for(woken.wait(), WAIT)  # woken once subscribed
            woken.clear()
            client = redis_client()
            client.publish(channel_on(client, ROUTING_CHANNEL), "probe")  # as audit.notices does
            await asyncio.wait_for(woken.wait(), WAIT)
        except TimeoutError:
            raise RuntimeError("; ".join(warnings.lines) or "no notification") from None
        finally:
            listening.cancel()
            await asyncio.gather(listening, return_exceptions=True)

    async def inflight() -> None:
        stub = SimpleNamespace(
            table=SimpleNamespace(routes={}),
            balancer=SimpleNamespace(health={}, inflight=lambda _replica: 0, failing=lambda: []),
            rooms={},
            source=source,
            metrics=SimpleNamespace(traffic=Traffic()),
        )
        reporting = asyncio.create_task(report_inflight(stub, interval=0.05))
        try:
            for _ in range(int(WAIT / 0.05)):
                if list(redis_client().scan_iter(INFLIGHT_KEY_PREFIX + "*")):
                    return
                if warnings.lines:
                    raise RuntimeError("; ".join(warnings.lines))
                await asyncio.sleep(0.05)
            raise RuntimeError("no in-flight report written")
        finally:
            reporting.cancel()
            await asyncio.gather(reporting, return_exceptions=True)

    attempt(results, "router_notifications", lambda: asyncio.run(notifications()))
    warnings.lines.clear()
    attempt(results, "router_inflight", lambda: asyncio.run(inflight()))


def agent(results: dict[str, str]) -> None:
    from agent_worker.celery import app

    # kombu imports django.utils if it can; the agent must load no settings, apps or ORM.
    server_side = ("llmgw_site", "fleet", "catalog", "audit", "router", "django.apps", "django.db")
    loaded = sorted(m for m in sys.modules if m.startswith(server_side))
    results["control_plane_modules"] = ", ".join(loaded) or "none"
    celery_steps(app, results)


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llmgw_site.settings")
    results: dict[str, str] = {}
    mode = {"control": control, "router": router, "agent": agent}[sys.argv[1]]
    attempt(results, "start", lambda: mode(results))
    print("PROBE " + json.dumps(results), flush=True)


if __name__ == "__main__":
    main()
