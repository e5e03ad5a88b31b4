"""Where the routing table and keys come from, and how they are kept fresh.

``DatabaseSource`` reads through Django's ORM on one dedicated thread, under the router's
own settings (``llmgw_site/router_settings.py``: no SECRET_KEY, a role that reads). Why the ORM and
not psycopg directly: the schema has one definition (models and migrations) shared with
the control plane, and reads happen only off the request path (start-up, a pub/sub
notification, every ``refresh_seconds``), where the ORM's cost does not matter. One
thread keeps one persistent connection and keeps the sync-only ORM off the event loop.

After each load ``DatabaseSource`` keeps the table on disk (saved.py), on the same
thread, so a router started while the database is down has something to serve.

``StaticSource`` reads a YAML file (router-only mode) and needs no database or Redis;
the periodic refresh re-reads it, so an edited file is picked up within seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from core.collector import collecting_less
from core.redis_urls import parse_redis_url
from core.subscriptions import listen_forever
from protocol.routing import ROUTING_CHANNEL, RoutingSnapshot
from router.table.routes import load_static
from router.table.saved import TableFile
from router.usage.accounting import PendingUsage

logger = logging.getLogger(__name__)

# A load's result: the table, and the keys (None when authentication is off).
Loaded = tuple[RoutingSnapshot, list[dict[str, Any]] | None]

# The router's Django settings: what it reads, and no secret of the fleet's.
ROUTER_SETTINGS = "llmgw_site.router_settings"
# After a failed reload, try again this soon (a lost Redis: core.subscriptions).
RETRY_SECONDS = 1.0


class StaticSource:
    mode = "static"
    notifies = False
    table_file: TableFile | None = None  # the file is the table: nothing to keep

    def __init__(self, path: str) -> None:
        self.path = path

    async def load(self) -> Loaded:
        return load_static(self.path)

    async def write_usage(self, rows: list[PendingUsage]) -> None:
        """Router-only mode keeps no accounting table; /metrics still counts tokens."""

    def close(self) -> None:
        pass


class DatabaseSource:
    mode = "database"
    notifies = True

    def __init__(self, table_file: TableFile | None = None) -> None:
        self.table_file = table_file
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="router-db")
        self._django_ready = False
        self.redis_url = ""

    async def _run(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn, *args)

    def _setup(self) -> None:
        if self._django_ready:
            return
        import django
        from django.conf import settings

        if not settings.configured:
            # Its own settings, whatever the environment names for the control plane's
            # processes: the router reads no SECRET_KEY and no fleet key.
            os.environ["DJANGO_SETTINGS_MODULE"] = ROUTER_SETTINGS
        django.setup()

        # redis-py's spelling of the URL's TLS options (ssl_cert_reqs=required, not CERT_…).
        self.redis_url = parse_redis_url(settings.REDIS_URL, "REDIS_URL").client_url
        self._django_ready = True

    def _load(self) -> Loaded:
        self._setup()
        from django.db import close_old_connections

        from catalog.keys import active_keys
        from fleet.routing_table import routing_snapshot

        close_old_connections()  # a connection the database dropped is replaced, not reused
        with collecting_less():  # a row per live replica and model, at once
            table, keys = routing_snapshot(), active_keys()
        if self.table_file is not None:
            self.table_file.save(table, keys, loaded_at=time.time())
        return table, keys

    async def load(self) -> Loaded:
        return await self._run(self._load)

    def _write(self, rows: list[PendingUsage]) -> None:
        self._setup()
        from django.db import close_old_connections

        from router.usage.accounting import write_usage

        close_old_connections()
        write_usage(rows)

    async def write_usage(self, rows: list[PendingUsage]) -> None:
        await self._run(self._write, rows)

    def _ledger(self, key_prefix: str, day_start: float, month_start: float) -> tuple[int, int]:
        self._setup()
        from django.db import close_old_connections

        from router.usage.accounting import ledger_totals

        close_old_connections()
        return ledger_totals(key_prefix, day_start, month_start)

    async def ledger_totals(
        self, key_prefix: str, day_start: float, month_start: float
    ) -> tuple[int, int]:
        """A key's tokens this day and month, as the usage rows hold them (the ledger)."""
        return await self._run(self._ledger, key_prefix, day_start, month_start)

    def write_usage_now(self, rows: list[PendingUsage]) -> None:
        """Write from the calling thread, which runs no event loop (at process exit, when
        the executor already refuses work)."""
        self._write(rows)

    def close(self) -> None:
        self._thread.shutdown(wait=False)


class Refresher:
    """Reload on every notification, and every ``interval`` seconds whatever happens."""

    def __init__(
        self, source: StaticSource | DatabaseSource, install: Callable[[Loaded], None],
        interval: float,
    ) -> None:  # fmt: skip
        self.source = source
        self.install = install
        self.interval = interval
        self._wake = asyncio.Event()
        self.last_error: str | None = None

    def wake(self) -> None:
        self._wake.set()

    async def reload(self) -> bool:
        try:
            snapshot = await self.source.load()
        except Exception as exc:
            self.last_error = f"{type(exc).__name__}: {exc}"
            logger.warning("routing table reload failed, keeping the last one: %s", exc)
            return False
        self.install(snapshot)
        self.last_error = None
        return True

    async def run(self) -> None:
        """Reload loop; notifications that arrive during a reload cause one more."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=self.interval)
            self._wake.clear()
            if not await self.reload():
                await asyncio.sleep(RETRY_SECONDS)
                self._wake.set()

    async def listen(self) -> None:
        """Wake on every message on the routing channel; reconnect when Redis goes away."""

        async def wake(_data: bytes) -> None:
            self.wake()

        # The URL is known once Django's settings are read, on the first load; on each
        # subscription, whatever changed while nothing listened is loaded.
        await listen_forever(lambda: getattr(self.source, "redis_url", ""), ROUTING_CHANNEL,
                             wake, self.wake, logger, "routing notifications")  # fmt: skip
