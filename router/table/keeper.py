"""The routing table and key set in use, and what keeps them current.

Every load (at start, on a notification, every ``LLMGW_ROUTER_REFRESH_SECONDS``:
sources.py) builds a new table and swaps it in with one assignment, so a request in
flight never sees half a table. When the database does not answer at start, the table it
gave last (saved.py) is served, to the engines that still answer its health check
(probe.py), until a load from the database replaces it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from router import errors
from router.config import RouterConfig
from router.metrics import RouterMetrics
from router.table.keys import Caller, KeyCache
from router.table.probe import SavedTableProbe
from router.table.routes import RoutingTable
from router.table.sources import DatabaseSource, Loaded, Refresher, StaticSource
from router.wire.upstream import Upstream

logger = logging.getLogger(__name__)


class TableKeeper:
    """The table and keys requests read, swapped whole on every load."""

    def __init__(
        self, config: RouterConfig, source: StaticSource | DatabaseSource, upstream: Upstream,
        metrics: RouterMetrics, on_change: Callable[[RoutingTable], None],
    ) -> None:  # fmt: skip
        """``on_change(table)`` runs once a new table is in use, before its first request."""
        self.source = source
        self.metrics = metrics
        self.on_change = on_change
        self.table = RoutingTable()
        self.keys = KeyCache()
        self.refresher = Refresher(source, self.install, config.refresh_seconds)
        self.probe = SavedTableProbe(upstream, self.use, config.probe_seconds,
                                     config.probe_timeout)  # fmt: skip
        self._probing: asyncio.Task | None = None
        metrics.table_age.set_function(self._table_age)

    def install(self, loaded: Loaded) -> None:
        """Swap in a freshly loaded table and key set."""
        snapshot, keys = loaded
        if self._probing is not None:  # the database answers: its table replaces the saved one
            self._probing.cancel()
            self._probing = None
            logger.warning("the database answers again; serving its routing table")
        self.keys.replace(keys)
        self.use(RoutingTable.from_snapshot(snapshot, source=self.source.mode))

    def use(self, table: RoutingTable) -> None:
        """Serve ``table`` from now on (the keys stay as they are)."""
        self.table = table
        self.on_change(table)
        self.metrics.table_models.set(len(table.routes))
        self.metrics.table_loaded.set(table.loaded_at)
        self.metrics.table_from_saved.set(1 if table.source == "saved" else 0)
        self.metrics.keys.set(len(self.keys))

    def _table_age(self) -> float:
        loaded_at = self.table.loaded_at
        return time.time() - loaded_at if loaded_at else float("nan")

    async def start(self) -> list[asyncio.Task]:
        """The first load (or, failing it, the saved table), then the tasks that keep the
        table current: reloads every interval and, with a database, on every notification."""
        if not await self.refresher.reload():  # retried by the refresh loop
            await self._serve_saved_table()
        tasks = [asyncio.create_task(self.refresher.run())]
        if self.source.notifies:
            tasks.append(asyncio.create_task(self.refresher.listen()))
        return tasks

    def stop(self) -> None:
        """Stop probing a saved table's engines (the tasks ``start`` gave are the caller's)."""
        if self._probing is not None:
            self._probing.cancel()
            self._probing = None

    async def _serve_saved_table(self) -> None:
        """The database did not answer at start: serve the table it gave last, to the
        engines that still answer, until a reload from the database replaces it."""
        table_file = self.source.table_file
        if table_file is None:
            return
        saved = await asyncio.to_thread(table_file.read)
        if saved is None:
            return
        table = RoutingTable.from_snapshot(saved.table, loaded_at=saved.loaded_at, source="saved")
        logger.warning(
            "the database does not answer (%s); serving the routing table saved in %s, "
            "loaded %.0f s ago", self.refresher.last_error, table_file.path,
            time.time() - saved.loaded_at,
        )  # fmt: skip
        self.keys.replace(saved.keys)
        self.use(await self.probe.check(table))  # the first round before the first request
        self._probing = asyncio.create_task(self.probe.run(table))

    def require_loaded(self) -> None:
        """Refuse with a 503 before the first load: keys are unknown then too, and a client
        is better told to wait than that its key is refused."""
        if self.table.loaded_at == 0:
            last_error = self.refresher.last_error
            raise errors.unavailable(
                "The router has not loaded its routing table yet"
                + (f" ({last_error})" if last_error else "")
                + "; try again shortly.",
                5,
                "routing_table_unavailable",
            )

    def serving(self, kind: str, caller: Caller) -> list[str]:
        """The models ``caller`` may use that serve ``kind``, for a refusal that says where
        to go instead (never another key's model)."""
        return sorted(
            name for name, route in self.table.routes.items()
            if kind in route.serves and caller.may_use(route.names)
        )  # fmt: skip
