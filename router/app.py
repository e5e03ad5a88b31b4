"""The router's ASGI application: a request in, dispatched by its path, an answer out.

A plain ASGI callable rather than a framework: every request passes through here, and
the budget is well under a millisecond of added latency. A ``/v1`` request for a model
reads top-down in three files: here (``Router.inference``), intake/reception.py (every
check, in the order clients get their errors, until a replica can take it: a ``Call``)
and forward/proxy.py (the call sent to a replica, retried or moved elsewhere, its answer
relayed back).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import time
from pathlib import Path

from protocol.rate_limits import counted_team, day_starts, month_starts, team_counter_name
from protocol.serving import KIND_OF_PATH, TOKENIZE_PATHS
from router import endpoints, errors
from router.balance.balancer import Balancer
from router.balance.inflight import report_inflight
from router.balance.response_ids import ResponseIds
from router.balance.waiting import WaitingRoom, WaitingRooms
from router.config import RouterConfig
from router.conversations.store import ConversationStore
from router.errors import RouterError
from router.forward.express import send_express
from router.forward.proxy import Proxy
from router.forward.stored import RESPONSES_PREFIX, StoredResponses
from router.intake.call import CLIENT_CLOSED, Receive, Send
from router.intake.cors import Cors
from router.intake.limits import RateLimiter
from router.intake.reception import EXPRESS_PATHS, Arrival, Reception
from router.intake.request_ids import request_id_for
from router.metrics import RouterMetrics
from router.responses import header, send_error
from router.table.keeper import TableKeeper
from router.table.routes import RoutingTable
from router.table.sources import DatabaseSource, StaticSource
from router.usage.accounting import Accounting
from router.usage.journal import Journal
from router.wire.cycle import RequestCycle
from router.wire.upstream import Upstream

logger = logging.getLogger(__name__)

# Every POST addressed to a model by the ``model`` of its body (or upload form).
MODEL_PATHS = frozenset(KIND_OF_PATH) | frozenset(TOKENIZE_PATHS)
# How long a stopping router waits for its background tasks to say their last words.
STOP_WAIT_SECONDS = 5.0


class Router:
    """One router process: its parts, built once, and the path each request takes."""

    def __init__(
        self, config: RouterConfig, source: StaticSource | DatabaseSource,
        upstream: Upstream | None = None,
    ) -> None:  # fmt: skip
        """``upstream`` is the outbound client; bench/ passes another one to compare."""
        self.config = config
        self.source = source
        self.metrics = RouterMetrics()
        self.upstream = upstream or Upstream(
            connect_timeout=config.connect_timeout,
            read_timeout=config.read_timeout,
            connections=config.upstream_connections,
        )
        self.balancer = Balancer(
            failure_threshold=config.breaker_failures,
            cooldown=config.breaker_cooldown,
            load_factor=config.affinity_load_factor,
        )
        self.tables = TableKeeper(config, source, self.upstream, self.metrics, self._table_changed)
        self.waiting = WaitingRooms(self.balancer, lambda: self.tables.table, config.queue_size,
                                    config.cold_start_timeout)  # fmt: skip

        def redis_url() -> str:  # the database source knows it once it has loaded
            return getattr(source, "redis_url", "")

        journal = None
        if source.mode == "database" and config.journal_dir:
            # One directory per database: a router adopts only the journals of its fleet.
            database = hashlib.sha256(os.environ.get("DATABASE_URL", "").encode()).hexdigest()
            journal = Journal(Path(config.journal_dir) / database[:12])
        self.accounting = Accounting(journal=journal)
        self.limiter = RateLimiter(
            redis_url, self.metrics, ledger=self._ledger if source.mode == "database" else None
        )
        self.accounting.adopted = self._adopted
        self.response_ids = ResponseIds(redis_url=redis_url)
        self.conversations = ConversationStore(
            redis_url, max_bytes=config.conversation_bytes, seconds=config.conversation_seconds
        )
        self.cors = Cors(config.cors_origins)
        self.reception = Reception(config, self.tables, self.limiter, self.waiting,
                                   self.response_ids, self.metrics,
                                   self.conversations)  # fmt: skip
        self.proxy = Proxy(
            self.balancer, self.upstream, self.metrics,
            # Router-only mode keeps no accounting table; /metrics still counts tokens.
            self.accounting if source.mode == "database" else None, config.migrations,
            current_route=lambda name: self.tables.table.routes.get(name),
            response_ids=self.response_ids,
        )  # fmt: skip
        self.stored_responses = StoredResponses(self.tables, self.response_ids, self.upstream,
                                                self.conversations)  # fmt: skip
        self.expressed = 0  # requests answered from callbacks (forward/express.py)
        self._started = False
        self._start_lock: asyncio.Lock | None = None
        self._tasks: list[asyncio.Task] = []

    @property
    def table(self) -> RoutingTable:
        """The routing table in use."""
        return self.tables.table

    @property
    def rooms(self) -> dict[str, WaitingRoom]:
        """Each model's waiting room (the in-flight report counts who waits)."""
        return self.waiting.rooms

    async def _ledger(self, key_prefix: str, now: float) -> tuple[int, int]:
        """A key's tokens this UTC day and month: the usage rows every router wrote, and
        what this one counted and has not written yet."""
        day_start, month_start = day_starts(now), month_starts(now)
        day, month = await self.source.ledger_totals(key_prefix, day_start, month_start)  # type: ignore[union-attr]
        team = counted_team(key_prefix)  # a team's: what its keys counted here
        for prefix in self.tables.keys.team_keys(team) if team else [key_prefix]:
            unwritten_day, unwritten_month = self.accounting.unwritten(prefix, day_start,
                                                                       month_start)  # fmt: skip
            day, month = day + unwritten_day, month + unwritten_month
        return day, month

    async def _adopted(self, key_prefixes: set[str]) -> None:
        """A gone router's journal is in the rows: its keys' totals raised to the ledger's,
        and their teams'."""
        teams = {team_counter_name(team) for team in self.tables.keys.teams_of(key_prefixes)}
        await self.limiter.raise_from_ledger(key_prefixes | teams)

    def _table_changed(self, table: RoutingTable) -> None:
        self.waiting.table_changed()  # a replica may have become ready
        self.balancer.forget_except(
            {e.replica for route in table.routes.values() for e in route.endpoints}
        )

    # -- dispatch -----------------------------------------------------------------------

    async def __call__(self, scope: dict, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            if not self._started:
                await self.start()
            await self.dispatch(scope, receive, send)
        elif kind == "lifespan":
            await self._lifespan(receive, send)

    async def dispatch(self, scope: dict, receive: Receive, send: Send) -> None:
        """Answer one HTTP request, by its path; every answer carries its request id."""
        path = scope["path"]
        request_id = request_id_for(header(scope, b"x-request-id"))
        send = self._answering(send, self._added_headers(scope, request_id))
        try:
            if scope["method"] == "OPTIONS" and self.cors.enabled:
                await endpoints.preflight(scope, send, self.cors)
            elif path in MODEL_PATHS:
                await self.inference(scope, receive, send, path, request_id)
            elif path.startswith(RESPONSES_PREFIX):
                await self.stored_responses.serve(scope, send, path, request_id)
            elif path == "/v1/models" or path.startswith("/v1/models/"):
                await endpoints.models(scope, send, path, self.tables)
            elif path == "/health":
                await endpoints.health(scope, send, self.tables, self.config.metrics_token)
            elif path == "/metrics":
                await endpoints.scrape(scope, send, self.config.metrics_token, self.metrics,
                                       self.balancer, self.tables)  # fmt: skip
            else:
                raise errors.not_found(path)
        except RouterError as exc:
            await send_error(send, exc, path)

    async def inference(
        self, scope: dict, receive: Receive, send: Send, path: str, request_id: bytes
    ) -> None:
        """A request for a model: taken in as a Call (intake/reception.py), forwarded to a
        replica (forward/proxy.py), and seen out, however it ended (charged, counted, logged)."""
        arrival = Arrival(path, request_id, started=time.perf_counter())
        try:
            call = await self.reception.take_call(arrival, scope, receive, send)
            arrival.status = CLIENT_CLOSED if call is None else await self.proxy.forward(call)
        except RouterError as exc:
            await send_error(send, arrival.refused(exc), path)
        finally:
            await self.reception.see_out(arrival)

    def express(self, cycle: RequestCycle) -> bool:
        """Answer ``cycle`` from the sockets' callbacks when nothing in it must wait
        (forward/express.py; router/wire/serving.py asks); False: ``dispatch`` answers it."""
        scope = cycle.scope
        path = scope["path"]
        if path not in EXPRESS_PATHS or scope["method"] != "POST" or not self._started:
            return False
        if not self.config.express:
            return False
        request_id = request_id_for(header(scope, b"x-request-id"))
        added = self._added_headers(scope, request_id)
        arrival = Arrival(path, request_id, started=time.perf_counter())
        body = cycle.body[0] if len(cycle.body) == 1 else b"".join(cycle.body)
        call = self.reception.take_now(arrival, scope, body, cycle.receive,
                                       self._answering(cycle.send, added))  # fmt: skip
        if call is None:
            return False
        if send_express(self.proxy, self.reception, call, arrival, cycle, added):
            self.expressed += 1
            return True
        if arrival.admission is not None:  # no connection free: the task path's to send
            self.limiter.settle_leased(arrival.admission)
        return False

    def _added_headers(self, scope: dict, request_id: bytes) -> list[tuple[bytes, bytes]]:
        """What every answer carries: the request id, CORS headers for an allowed origin."""
        return [(b"x-request-id", request_id), *self.cors.headers(header(scope, b"origin"))]

    def _answering(self, send: Send, extra: list[tuple[bytes, bytes]]) -> Send:
        """``send``, with ``extra`` added to the answer's headers, whoever answers: the
        router or an engine."""

        async def answer(message: dict) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), *extra]}
            await send(message)

        return answer

    # -- life cycle -------------------------------------------------------------------

    async def start(self) -> None:
        """Load the table and start the background tasks; once, on the first need."""
        if self._start_lock is None:
            self._start_lock = asyncio.Lock()
        async with self._start_lock:
            if self._started:
                return
            await self.upstream.start()
            self._tasks += await self.tables.start()
            if self.source.notifies:
                self._tasks.append(asyncio.create_task(report_inflight(self)))
            self._tasks.append(asyncio.create_task(self.limiter.renew_holds()))
            self._tasks.append(asyncio.create_task(
                self.accounting.flush_every(self.config.accounting_seconds,
                                            self.source.write_usage)
            ))  # fmt: skip
            self._started = True

    async def stop(self) -> None:
        logger.info("router stopping: %d requests were answered the express way", self.expressed)
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        # Awaited, not only cancelled: the in-flight report's last words (that this router
        # left, which walls it out of engines at once) are written in its ``finally``, and
        # the server closes the loop soon after this returns. Bounded: with Redis away
        # those words are lost anyway, and a stop must not hang on them.
        if tasks:
            await asyncio.wait(tasks, timeout=STOP_WAIT_SECONDS)
        self.tables.stop()
        await self.accounting.flush(self.source.write_usage)
        self.accounting.close()
        await self.upstream.close()
        await self.limiter.close()
        await self.response_ids.close()
        await self.conversations.close()
        self._started = False

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.start()
                except Exception as exc:
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.stop()
                await send({"type": "lifespan.shutdown.complete"})
                return
