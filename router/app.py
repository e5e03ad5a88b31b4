"""The router's ASGI application: authenticate, pick a replica, relay the answer.

A plain ASGI callable rather than a framework: every request passes through here, and
the budget is well under a millisecond of added latency. The order of checks is fixed
so clients get the most useful error first: 401 (key), 413 (size), 400 (JSON, model),
404 (unknown model), 403 (key not allowed the model), 400 (a field an engine cannot use,
intake/body_checks.py), 503 (nothing ready). A request that passes them becomes a ``Call``
(intake/call.py), which the proxy (forward/proxy.py) forwards.
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import logging
import time
from dataclasses import replace

from protocol.serving import (
    KIND_OF_PATH,
    MULTIPART_PATHS,
    STREAMING_PATHS,
    TOKENIZE_PATHS,
    TRANSLATED_PATHS,
)
from router import errors
from router.balance.balancer import Balancer
from router.balance.inflight import report_inflight
from router.balance.prefix import affinity_for
from router.balance.response_ids import ResponseIds, previous_response_id
from router.balance.waiting import WaitingRoom
from router.config import RouterConfig
from router.errors import RouterError
from router.forward.proxy import Proxy
from router.forward.relay import rewrite_body
from router.intake.body_checks import check_body
from router.intake.call import CLIENT_CLOSED, Call, read_body, resolve
from router.intake.cors import Cors
from router.intake.limits import Admission, RateLimiter
from router.intake.request_ids import log_request, request_id_for
from router.intake.uploads import read_upload, resolve_upload
from router.metrics import RouterMetrics
from router.responses import header, model_entry, send_empty, send_error, send_json
from router.table.keys import Caller, KeyCache
from router.table.probe import SavedTableProbe
from router.table.routes import ModelRoute, RoutingTable
from router.table.sources import DatabaseSource, Loaded, Refresher, StaticSource
from router.translate.plan import Translation
from router.usage.accounting import Accounting
from router.wire.upstream import HOP_REQUEST_HEADERS, Upstream

logger = logging.getLogger(__name__)

# Every POST addressed to a model by the ``model`` of its body (or upload form).
MODEL_PATHS = frozenset(KIND_OF_PATH) | frozenset(TOKENIZE_PATHS)
# Where the router asks for usage in the stream on the client's behalf.
USAGE_OPTION_PATHS = frozenset({"/v1/chat/completions", "/v1/completions"})
RESPONSES_PREFIX = "/v1/responses/"


class Router:
    """The router process's state: table, keys, balancer, metrics, upstream pool."""

    def __init__(
        self, config: RouterConfig, source: StaticSource | DatabaseSource,
        upstream: Upstream | None = None,
    ) -> None:  # fmt: skip
        """``upstream`` is the outbound client; bench/ passes another one to compare."""
        self.config = config
        self.source = source
        self.table = RoutingTable()
        self.keys = KeyCache()
        self.balancer = Balancer(
            failure_threshold=config.breaker_failures,
            cooldown=config.breaker_cooldown,
            load_factor=config.affinity_load_factor,
        )
        self.metrics = RouterMetrics()
        self.limiter = RateLimiter(lambda: getattr(self.source, "redis_url", ""), self.metrics)
        self.rooms: dict[str, WaitingRoom] = {}  # by model: requests waiting for a replica
        self.accounting = Accounting()
        self.cors = Cors(config.cors_origins)
        self.response_ids = ResponseIds(redis_url=lambda: getattr(self.source, "redis_url", ""))
        self.upstream = upstream or Upstream(
            connect_timeout=config.connect_timeout,
            read_timeout=config.read_timeout,
            connections=config.upstream_connections,
        )
        # Router-only mode keeps no accounting table; /metrics still counts tokens.
        accounting = self.accounting if source.mode == "database" else None
        self.proxy = Proxy(
            self.balancer, self.upstream, self.metrics, accounting, config.migrations,
            current_route=lambda name: self.table.routes.get(name),
            response_ids=self.response_ids,
        )  # fmt: skip
        self.refresher = Refresher(source, self.install, config.refresh_seconds)
        self.probe = SavedTableProbe(
            self.upstream, self._use, config.probe_seconds, config.probe_timeout
        )
        self.metrics.table_age.set_function(self._table_age)
        self._started = False
        self._start_lock: asyncio.Lock | None = None
        self._tasks: list[asyncio.Task] = []
        self._probing: asyncio.Task | None = None

    # -- life cycle -------------------------------------------------------------------

    def install(self, loaded: Loaded) -> None:
        """Swap in a freshly loaded table and key set."""
        snapshot, keys = loaded
        if self._probing is not None:  # the database answers: its table replaces the saved one
            self._probing.cancel()
            self._probing = None
            logger.warning("the database answers again; serving its routing table")
        self.keys.replace(keys)
        self._use(RoutingTable.from_snapshot(snapshot, source=self.source.mode))

    def _use(self, table: RoutingTable) -> None:
        self.table = table
        for name, room in self.rooms.items():  # a replica may have become ready
            room.notify(functools.partial(self._can_take, name))
        self.balancer.forget_except(
            {e.replica for route in table.routes.values() for e in route.endpoints}
        )
        self.metrics.table_models.set(len(table.routes))
        self.metrics.table_loaded.set(table.loaded_at)
        self.metrics.table_from_saved.set(1 if table.source == "saved" else 0)
        self.metrics.keys.set(len(self.keys))

    def _table_age(self) -> float:
        loaded_at = self.table.loaded_at
        return time.time() - loaded_at if loaded_at else float("nan")

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
        self._use(await self.probe.check(table))  # the first round before the first request
        self._probing = asyncio.create_task(self.probe.run(table))

    async def start(self) -> None:
        """Load the table and start the background tasks; once, on the first need."""
        if self._start_lock is None:
            self._start_lock = asyncio.Lock()
        async with self._start_lock:
            if self._started:
                return
            await self.upstream.start()
            if not await self.refresher.reload():  # retried by the refresh loop
                await self._serve_saved_table()
            self._tasks.append(asyncio.create_task(self.refresher.run()))
            if self.source.notifies:
                self._tasks.append(asyncio.create_task(self.refresher.listen()))
                self._tasks.append(asyncio.create_task(report_inflight(self)))
            self._tasks.append(asyncio.create_task(self._write_accounting()))
            self._started = True

    async def stop(self) -> None:
        for task in [*self._tasks, *([self._probing] if self._probing else [])]:
            task.cancel()
        self._tasks.clear()
        self._probing = None
        await self._flush_accounting()
        await self.upstream.close()
        await self.limiter.close()
        await self.response_ids.close()
        self._started = False

    async def _write_accounting(self) -> None:
        while True:
            await asyncio.sleep(self.config.accounting_seconds)
            await self._flush_accounting()

    async def _flush_accounting(self) -> None:
        rows = self.accounting.take()
        if not rows:
            return
        try:
            await self.source.write_usage(rows)
        except Exception as exc:
            logger.warning("accounting not written, keeping it for the next try: %s", exc)
            self.accounting.restore(rows)

    # -- dispatch -----------------------------------------------------------------------

    async def __call__(self, scope: dict, receive, send) -> None:
        kind = scope["type"]
        if kind == "http":
            if not self._started:
                await self.start()
            path = scope["path"]
            request_id = request_id_for(header(scope, b"x-request-id"))
            send = self._answering(scope, send, request_id)
            try:
                if scope["method"] == "OPTIONS" and self.cors.enabled:
                    await self.preflight(scope, send)
                elif path in MODEL_PATHS:
                    await self.inference(scope, receive, send, path, request_id)
                elif path.startswith(RESPONSES_PREFIX):
                    await self.stored_response(scope, send, path, request_id)
                elif path == "/v1/models" or path.startswith("/v1/models/"):
                    await self.models(scope, send, path)
                elif path == "/health":
                    await self.health(send)
                elif path == "/metrics":
                    await self.scrape(scope, send)
                else:
                    raise errors.not_found(path)
            except RouterError as exc:
                await send_error(send, exc, path)
        elif kind == "lifespan":
            await self._lifespan(receive, send)

    def _answering(self, scope: dict, send, request_id: bytes):
        """``send``, with the request id (and CORS headers for an allowed origin) added
        to the answer's headers, whoever answers: the router or an engine."""
        extra = [(b"x-request-id", request_id), *self.cors.headers(header(scope, b"origin"))]

        async def answer(message: dict) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), *extra]}
            await send(message)

        return answer

    async def preflight(self, scope: dict, send) -> None:
        """A browser asking whether it may send the request it is about to."""
        allowed = self.cors.preflight(
            header(scope, b"origin"), header(scope, b"access-control-request-headers")
        )
        if allowed is None:
            raise RouterError(
                403, "This origin may not call the router from a browser; an operator adds "
                "it to LLMGW_ROUTER_CORS_ORIGINS.", "permission_error", "origin_not_allowed",
            )  # fmt: skip
        await send_empty(send, 204, allowed)

    async def _lifespan(self, receive, send) -> None:
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

    # -- /v1 inference ------------------------------------------------------------------

    async def inference(self, scope: dict, receive, send, path: str, request_id: bytes) -> None:
        started = time.perf_counter()
        model_label = ""
        code = 500
        admission: Admission | None = None
        call: Call | None = None
        caller = None
        try:
            if scope["method"] != "POST":
                raise errors.method_not_allowed(scope["method"], "POST")
            authorization = api_key = content_length = content_type = session = None
            forward: list[tuple[bytes, bytes]] = [(b"x-request-id", request_id)]
            for name, value in scope["headers"]:
                if name == b"authorization":
                    authorization = value
                elif name == b"x-api-key":  # how Anthropic's clients send their key
                    api_key = value
                elif name == b"content-length":
                    content_length = value
                elif name not in HOP_REQUEST_HEADERS and name != b"x-request-id":
                    if name == b"x-session-id":
                        session = value.decode("latin-1")
                    elif name == b"content-type":
                        content_type = value
                    forward.append((name, value))
            self._require_table()
            caller = self.keys.authenticate(authorization, api_key)
            upload = None
            if path in MULTIPART_PATHS:
                upload = await read_upload(
                    receive, content_length, content_type, self.config.max_body,
                    self.config.max_upload,
                )  # fmt: skip
                if upload is None:
                    code = CLIENT_CLOSED
                    return
                body = upload.head
                route, payload = resolve_upload(self.table, upload, content_type, caller)
            else:
                read = await read_body(receive, content_length, self.config.max_body)
                if read is None:
                    code = CLIENT_CLOSED
                    return
                body = read
                route, payload = resolve(self.table, body, caller)
            model_label = route.name
            kind = KIND_OF_PATH.get(path)  # None: /tokenize, which every kind serves
            if kind is not None and kind not in route.serves:
                raise errors.not_served(route.name, path, kind, route.serves, self._serving(kind))
            check_body(path, payload, self.config.max_choices)
            translation = None
            if path in TRANSLATED_PATHS:
                translation = Translation.of(
                    path, payload, route.name, always=self.config.translate == "always"
                )
            route = await self._pinned(route.serving(kind), payload, path)
            if translation is not None and all(translation.applies_to(e) for e in route.endpoints):
                translation.check()  # refused now, if it must be translated and cannot be
            if not route.endpoints and not route.autoscaled:
                message, retry_after = route.unavailable()
                raise errors.unavailable(message, retry_after)
            admission = await self.limiter.admit(caller)
            # An upload's rest is still to be read: nothing else may read the client meanwhile.
            waited = await self._wait_for_replica(route, caller, None if upload else receive)
            if waited is None:
                code = CLIENT_CLOSED
                return
            if waited is not route:  # the table's route as it is now
                route = await self._pinned(waited.serving(kind), payload, path)
            session = affinity_for(route, payload, path, session, self.config)
            stream = payload.get("stream") is True and path in STREAMING_PATHS
            if path in MULTIPART_PATHS:
                drop_usage_only = False  # the upload goes as it came
            else:
                body, drop_usage_only = rewrite_body(
                    body, payload, route, stream and path in USAGE_OPTION_PATHS
                )
            call = Call(
                receive=receive, send=send, path=path, route=route, body=body, headers=forward,
                caller=caller, session=session, drop_usage_only=drop_usage_only, started=started,
                limit_headers=admission.headers if admission else [], kind=kind,
                translation=translation, query=scope.get("query_string", b""), upload=upload,
            )  # fmt: skip
            code = await self.proxy.forward(call)
        except RouterError as exc:
            code = exc.status
            if admission is not None and exc.status != 429:
                exc.headers = [*exc.headers, *admission.headers]
            await send_error(send, exc, path)
        finally:
            if admission is not None:
                await self.limiter.charge(admission, call.tokens_spent if call else 0)
            room = self.rooms.get(model_label)
            if room is not None:  # this request's place on a replica is free again
                room.notify(lambda: self._can_take(model_label))
            elapsed = time.perf_counter() - started
            self.metrics.request_done(model_label, code, elapsed)
            log_request(request_id, path, model_label, caller, code, elapsed, call)

    async def stored_response(self, scope: dict, send, path: str, request_id: bytes) -> None:
        """``GET``/``DELETE /v1/responses/{id}`` (and what lies under it): relayed to the
        replica that made that response, the only one that may have kept it."""
        if scope["method"] not in ("GET", "DELETE", "POST"):
            raise errors.method_not_allowed(scope["method"], "GET, DELETE")
        self._require_table()
        caller = self.keys.authenticate(
            header(scope, b"authorization"), header(scope, b"x-api-key")
        )
        response_id = path.removeprefix(RESPONSES_PREFIX).split("/", 1)[0]
        made_by = await self.response_ids.made_by(response_id)
        route = self.table.routes.get(made_by.model) if made_by else None
        # A response of a model the key may not use is as unknown as one never made.
        if made_by is None or route is None or not caller.may_use(route.names):
            raise errors.unknown_response(response_id)
        endpoint = next((e for e in route.endpoints if e.replica == made_by.replica), None)
        if endpoint is None:
            raise errors.response_replica_gone(response_id, route.name, made_by.replica)
        query = scope.get("query_string", b"")
        target = path + ("?" + query.decode("latin-1") if query else "")
        status = await self.proxy.pass_through(
            scope["method"], endpoint, target, [(b"x-request-id", request_id)], send
        )
        if scope["method"] == "DELETE" and status < 300:
            await self.response_ids.forget(response_id)

    def _serving(self, kind: str) -> list[str]:
        """The models that serve ``kind``, for a refusal that says where to go instead."""
        return sorted(name for name, route in self.table.routes.items() if kind in route.serves)

    async def _pinned(self, route: ModelRoute, payload: dict, path: str) -> ModelRoute:
        """The route, narrowed to the replica that made the response a Responses request
        continues (``previous_response_id``); 400 when that replica is unknown or gone."""
        if path != "/v1/responses":
            return route
        wanted = previous_response_id(payload)
        if wanted is None:
            return route
        made_by = await self.response_ids.made_by(wanted)
        if made_by is None:
            raise errors.unknown_response(wanted)
        endpoint = next((e for e in route.endpoints if e.replica == made_by.replica), None)
        if endpoint is None:
            raise errors.response_replica_gone(wanted, route.name, made_by.replica)
        return replace(route, endpoints=(endpoint,), autoscaled=False)

    def _can_take(self, name: str) -> bool:
        """Whether a replica of model ``name`` could take one more request now."""
        route = self.table.routes.get(name)
        if route is None or not route.endpoints:
            return False
        limit = route.concurrency
        return not limit or any(self.balancer.inflight(e.replica) < limit for e in route.endpoints)

    async def _wait_for_replica(
        self, route: ModelRoute, caller: Caller, receive
    ) -> ModelRoute | None:
        """The route once a replica can take the request: at once, or after waiting for
        one to start (an autoscaled model at zero) or to free a place (at concurrency);
        None when the client left while it waited."""
        if route.endpoints and not route.concurrency:
            return route
        room = self.rooms.get(route.name)
        if room is None:
            room = self.rooms[route.name] = WaitingRoom(route.name, self.config.queue_size)
        deadline = time.monotonic() + self.config.cold_start_timeout
        # A client that leaves gives up its place, and no replica is started or used for it.
        leaving = asyncio.ensure_future(
            _disconnect(receive) if receive is not None else asyncio.Event().wait()
        )
        try:
            while True:
                patience = max(deadline - time.monotonic(), 0.0)
                waiting = asyncio.ensure_future(
                    room.wait(caller.priority, lambda: self._can_take(route.name), patience)
                )
                try:
                    await asyncio.wait({waiting, leaving}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    if not waiting.done():
                        waiting.cancel()
                if not waiting.done() or waiting.cancelled():
                    return None
                waiting.result()  # the room's 429 or 503, if it gave one
                # Checked again here, where nothing runs between this check and the pick:
                # another request woken at the same moment may have taken the place.
                if self._can_take(route.name):
                    return self.table.routes.get(route.name, route)
        finally:
            if not leaving.done():
                leaving.cancel()

    def _require_table(self) -> None:
        """Before the first load, keys are unknown too: say so rather than refuse the key."""
        if self.table.loaded_at == 0:
            raise errors.unavailable(
                "The router has not loaded its routing table yet"
                + (f" ({self.refresher.last_error})" if self.refresher.last_error else "")
                + "; try again shortly.",
                5,
                "routing_table_unavailable",
            )

    # -- everything else ------------------------------------------------------------------

    async def models(self, scope: dict, send, path: str) -> None:
        if scope["method"] != "GET":
            raise errors.method_not_allowed(scope["method"], "GET")
        self._require_table()
        caller = self.keys.authenticate(
            header(scope, b"authorization"), header(scope, b"x-api-key")
        )
        table = self.table
        listed = [
            model_entry(route, table.loaded_at)
            for route in table.routes.values()
            if route.endpoints and caller.may_use(route.names)
        ]
        if path == "/v1/models":
            await send_json(send, 200, {"object": "list", "data": listed})
            return
        wanted = path.removeprefix("/v1/models/")
        route = table.by_name.get(wanted)
        entry = next((e for e in listed if route is not None and e["id"] == route.name), None)
        if entry is None:
            raise errors.unknown_model(wanted, [e["id"] for e in listed])
        await send_json(send, 200, entry)

    async def health(self, send) -> None:
        table = self.table
        loaded = table.loaded_at > 0
        # A saved table still serves (200), but what it says may be out of date.
        status = ("degraded" if table.source == "saved" else "ok") if loaded else "loading"
        body = {
            "status": status,
            "mode": self.source.mode,
            "table_source": table.source if loaded else None,
            "models": len(table.routes),
            "routable_models": sum(1 for r in table.routes.values() if r.endpoints),
            "table_age_seconds": round(time.time() - table.loaded_at, 3) if loaded else None,
            "api_keys": len(self.keys),
            "last_error": self.refresher.last_error,
        }
        await send_json(send, 200 if loaded else 503, body)

    async def scrape(self, scope: dict, send) -> None:
        token = self.config.metrics_token
        sent = header(scope, b"authorization") or b""
        # Constant time: a byte-by-byte compare would tell a prober how much it got right.
        if token and not hmac.compare_digest(sent, f"Bearer {token}".encode()):
            raise RouterError(
                401, "/metrics needs `Authorization: Bearer <LLMGW_METRICS_TOKEN>`.",
                "invalid_request_error", "invalid_metrics_token",
            )  # fmt: skip
        # Per-replica gauges come from the balancer at scrape time, not per request.
        self.metrics.replicas(
            [
                (route.name, e.replica, self.balancer.inflight(e.replica),
                 self.balancer.is_open(e.replica))
                for route in self.table.routes.values()
                for e in route.endpoints
            ]
        )  # fmt: skip
        body = self.metrics.render()
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", self.metrics.content_type.encode())],
            }
        )
        await send({"type": "http.response.body", "body": body})


async def _disconnect(receive) -> None:
    """Return once the client has hung up (the body was read whole before this)."""
    while (await receive())["type"] != "http.disconnect":
        pass
