"""The front desk of ``/v1`` inference: every check a request passes, in order, and the
``Call`` (call.py) it becomes once a replica can take it.

The order is fixed so a client gets the most useful error first: 405 (method), 503 (no
table loaded yet), 401 (key), 411 or 413 (size), 400 (JSON, model), 404 (unknown model),
403 (key not allowed the model), 400 (a kind the model does not serve), 404 or 400 (a
``previous_response_id`` of another key, or of a conversation too long to be kept, where
the router keeps them: conversations/chains.py), 400 (a field an engine cannot use:
body_checks.py; a media URL that points inside the fleet: media_urls.py), 404 (a
``previous_response_id`` no replica holds), 400 (a body that must be translated and
cannot be), 503 (nothing ready), 429 (the key's limits:
limits.py), and then a wait for a replica when none can take the request now
(balance/waiting.py: 429 when its room is full, 503 past its patience). The proxy
(forward/proxy.py) takes the Call from there.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from protocol.serving import KIND_OF_PATH, MULTIPART_PATHS, STREAMING_PATHS, TRANSLATED_PATHS
from router import errors
from router.balance.prefix import affinity_for
from router.balance.response_ids import ResponseIds, previous_response_id
from router.balance.waiting import WaitingRooms
from router.config import RouterConfig
from router.conversations.chains import Chain, continued
from router.conversations.store import ConversationStore
from router.errors import RouterError
from router.intake.body_checks import check_body
from router.intake.call import Call, Receive, Send, Upload, read_body, resolve, rewrite_body
from router.intake.limited import Admission, worst_case
from router.intake.limits import RateLimiter
from router.intake.media_urls import MediaUrlPolicy, may_name_media
from router.intake.request_ids import log_request
from router.intake.uploads import read_upload, resolve_upload
from router.metrics import RouterMetrics
from router.table.keeper import TableKeeper
from router.table.keys import Caller
from router.table.routes import ModelRoute
from router.translate.plan import Translation
from router.wire.compact_json import compact_json
from router.wire.upstream import HOP_REQUEST_HEADERS

RESPONSES_PATH = "/v1/responses"
# Where the router asks for usage in the stream on the client's behalf.
USAGE_OPTION_PATHS = frozenset({"/v1/chat/completions", "/v1/completions"})
# What may be answered from callbacks (forward/express.py): neither translated nor uploaded.
EXPRESS_PATHS = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/embeddings"})


@dataclass
class Arrival:
    """One inference request from its first byte to its log line: what is known of it so
    far, for the bookkeeping at its end however far it got."""

    path: str
    request_id: bytes
    started: float  # time.perf_counter() when it arrived
    status: int = 500  # what the client got; 500 until something else is known
    model: str = ""  # the route's name once the body named one
    caller: Caller | None = None
    admission: Admission | None = None  # counted against its key's limits
    call: Call | None = None

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def refused(self, error: RouterError) -> RouterError:
        """``error`` as the client gets it: with the key's rate limit headers once the
        request was admitted (a 429 carries its own)."""
        self.status = error.status
        if self.admission is not None and error.status != 429:
            error.headers = [*error.headers, *self.admission.headers]
        return error


class Head(NamedTuple):
    """What the request's headers say, read in one pass."""

    authorization: bytes | None
    api_key: bytes | None  # x-api-key: how Anthropic's clients send their key
    content_length: bytes | None
    content_type: bytes | None
    session: str | None  # x-session-id, for affinity
    forward: list[tuple[bytes, bytes]]  # what the engine is sent: all but this hop's


def read_head(headers: list[tuple[bytes, bytes]], request_id: bytes) -> Head:
    """The request's headers sorted out: the key, the body's length and type, the session,
    and those the engine is sent (the request id first)."""
    authorization = api_key = content_length = content_type = session = None
    forward: list[tuple[bytes, bytes]] = [(b"x-request-id", request_id)]
    for name, value in headers:
        if name == b"authorization":
            authorization = value
        elif name == b"x-api-key":
            api_key = value
        elif name == b"content-length":
            content_length = value
        elif name not in HOP_REQUEST_HEADERS and name != b"x-request-id":
            if name == b"x-session-id":
                session = value.decode("latin-1")
            elif name == b"content-type":
                content_type = value
            forward.append((name, value))
    return Head(authorization, api_key, content_length, content_type, session, forward)


class Reception:
    """Takes inference requests in, and sees each one out."""

    def __init__(
        self, config: RouterConfig, tables: TableKeeper, limiter: RateLimiter,
        waiting: WaitingRooms, response_ids: ResponseIds, metrics: RouterMetrics,
        conversations: ConversationStore | None = None,
    ) -> None:  # fmt: skip
        self.config = config
        self.tables = tables
        self.limiter = limiter
        self.waiting = waiting
        self.response_ids = response_ids
        self.metrics = metrics
        self.conversations = conversations or ConversationStore()
        self.media = MediaUrlPolicy(config.allow_private_urls)

    async def take_call(
        self, arrival: Arrival, scope: dict[str, Any], receive: Receive, send: Send
    ) -> Call | None:
        """The request as a Call, once it passed every check and a replica can take it;
        None when the client left first. Raises the RouterError to answer instead."""
        path = arrival.path
        # Who asks, and for which model.
        if scope["method"] != "POST":
            raise errors.method_not_allowed(scope["method"], "POST")
        head = read_head(scope["headers"], arrival.request_id)
        self.tables.require_loaded()
        arrival.caller = caller = self.tables.keys.authenticate(head.authorization, head.api_key)
        read = await self._read(path, receive, head, caller)
        if read is None:
            return None
        body, upload, route, payload = read
        arrival.model = route.name
        # Whether the model, as it is served now, can do what is asked.
        kind = KIND_OF_PATH.get(path)  # None: /tokenize, which every kind serves
        if kind is not None and kind not in route.serves:
            raise errors.not_served(route.name, path, kind, route.serves,
                                    self.tables.serving(kind, caller),
                                    restricted=bool(caller.models))  # fmt: skip
        chain = None
        if path == RESPONSES_PATH:  # its conversation so far, where the router keeps it
            body, payload, chain = await self._continued(body, payload, caller, route.name)
        check_body(path, payload, self.config.max_choices)
        await self.media.check(payload, self.tables.table.engine_hosts,
                               body if upload is None else None)  # fmt: skip
        translation = None
        if path in TRANSLATED_PATHS:
            translation = Translation.of(
                path, payload, route.name, always=self.config.translate == "always"
            )
        route = await self._pinned(route.serving(kind), payload, path, caller)
        if translation is not None and all(translation.applies_to(e) for e in route.endpoints):
            translation.check()  # refused now, if it must be translated and cannot be
        if not route.endpoints and not route.autoscaled:
            message, retry_after = route.unavailable()
            raise errors.unavailable(message, retry_after)
        # Within the key's limits, a replica that can take it, now or after a wait.
        arrival.admission = await self.limiter.admit(
            caller, worst_case(path, payload, body, self.config.reserve_tokens)
        )
        # An upload's rest is still to be read: nothing else may read the client meanwhile.
        waited = await self.waiting.wait_for_replica(route, caller, None if upload else receive)
        if waited is None:
            return None
        if waited is not route:  # the table's route as it is now
            route = await self._pinned(waited.serving(kind), payload, path, caller)
        return self._call(arrival, scope, head, route, payload, body, receive, send,
                          translation=translation, upload=upload, chain=chain)  # fmt: skip

    def take_now(
        self, arrival: Arrival, scope: dict[str, Any], body: bytes, receive: Receive, send: Send
    ) -> Call | None:
        """``take_call`` without a wait, for a request whose body is all here and that
        nothing makes wait (forward/express.py): a JSON request without media URLs, of a
        key whose limits are caps alone (or none), for a model ready now. None: nothing
        was counted, and ``take_call`` takes it (and says why when it refuses it)."""
        path = arrival.path
        head = read_head(scope["headers"], arrival.request_id)
        if len(body) > self.config.max_body or path not in EXPRESS_PATHS:
            return None
        try:
            self.tables.require_loaded()
            caller = self.tables.keys.authenticate(head.authorization, head.api_key)
            route, payload = resolve(self.tables.table, body, caller)
            check_body(path, payload, self.config.max_choices)
        except RouterError:
            return None
        kind = KIND_OF_PATH[path]
        if kind not in route.serves or may_name_media(body):
            return None
        route = route.serving(kind)
        if not route.endpoints or route.concurrency:
            return None
        admitted, admission = self.limiter.admit_now(caller)
        if not admitted:
            return None
        arrival.caller, arrival.model, arrival.admission = caller, route.name, admission
        return self._call(arrival, scope, head, route, payload, body, receive, send)

    def _call(
        self, arrival: Arrival, scope: dict[str, Any], head: Head, route: ModelRoute,
        payload: dict[str, Any], body: bytes, receive: Receive, send: Send, *,
        translation: Translation | None = None, upload: Upload | None = None,
        chain: Chain | None = None,
    ) -> Call:  # fmt: skip
        """The call, as the proxy forwards it."""
        path = arrival.path
        session = affinity_for(route, payload, path, head.session, self.config)
        body, drop_usage_only = _body_for_engine(path, body, payload, route)
        admission, caller = arrival.admission, arrival.caller
        assert caller is not None  # known before its body was read
        arrival.call = Call(
            receive=receive, send=send, path=path, route=route, body=body, headers=head.forward,
            caller=caller, session=session, drop_usage_only=drop_usage_only,
            started=arrival.started, limit_headers=admission.headers if admission else [],
            kind=KIND_OF_PATH.get(path), translation=translation,
            query=scope.get("query_string", b""), upload=upload, chain=chain,
        )  # fmt: skip
        return arrival.call

    async def see_out(self, arrival: Arrival) -> None:
        """However the request ended: its tokens charged to its key, its place on a replica
        offered to the next waiter, its metrics and its log line."""
        admission = arrival.admission
        if admission is not None and not self.limiter.settle_leased(admission):
            call = arrival.call
            await self.limiter.charge(admission, call.tokens_spent if call else 0)
        self._seen_out(arrival)

    def see_out_now(self, arrival: Arrival) -> None:
        """``see_out`` of a request ``take_now`` took (its places are given back at once)."""
        if arrival.admission is not None:
            self.limiter.settle_leased(arrival.admission)
        self._seen_out(arrival)

    def _seen_out(self, arrival: Arrival) -> None:
        self.waiting.place_freed(arrival.model)
        elapsed = arrival.elapsed()
        self.metrics.request_done(arrival.model, arrival.status, elapsed)
        log_request(arrival.request_id, arrival.path, arrival.model, arrival.caller,
                    arrival.status, elapsed, arrival.call)  # fmt: skip

    async def _read(
        self, path: str, receive: Receive, head: Head, caller: Caller
    ) -> tuple[bytes, Upload | None, ModelRoute, dict[str, Any]] | None:
        """The body (an upload's head), the upload, and the route and payload the body
        names; None when the client left before it was read."""
        config = self.config
        if path in MULTIPART_PATHS:
            upload = await read_upload(receive, head.content_length, head.content_type,
                                       config.max_body, config.max_upload)  # fmt: skip
            if upload is None:
                return None
            route, payload = resolve_upload(self.tables.table, upload, head.content_type, caller)
            return upload.head, upload, route, payload
        body = await read_body(receive, head.content_length, config.max_body)
        if body is None:
            return None
        route, payload = resolve(self.tables.table, body, caller)
        return body, None, route, payload

    async def _continued(
        self, body: bytes, payload: dict[str, Any], caller: Caller, model: str
    ) -> tuple[bytes, dict[str, Any], Chain | None]:
        """A Responses request with the conversation it continues put into its input, when
        the router keeps that conversation (its body then written anew), and where its
        answer will be kept."""
        found = await continued(self.conversations, payload, caller, model)
        if found.expanded:
            body = compact_json(found.payload)
        return body, found.payload, found.chain

    async def _pinned(
        self, route: ModelRoute, payload: dict, path: str, caller: Caller
    ) -> ModelRoute:
        """The route, narrowed to the replica that made the response a Responses request
        continues (``previous_response_id``); 404 when that replica is unknown or gone, or
        the response is another key's."""
        if path != "/v1/responses":
            return route
        wanted = previous_response_id(payload)
        if wanted is None:
            return route
        made_by = await self.response_ids.made_by(wanted)
        if made_by is None or not made_by.for_caller(caller.owner):
            raise errors.unknown_response(wanted)  # another key's is as unknown as none
        endpoint = next((e for e in route.endpoints if e.replica == made_by.replica), None)
        if endpoint is None:
            raise errors.response_replica_gone(wanted, route.name, made_by.replica)
        return replace(route, endpoints=(endpoint,), autoscaled=False)


def _body_for_engine(
    path: str, body: bytes, payload: dict[str, Any], route: ModelRoute
) -> tuple[bytes, bool]:
    """The body the engine is sent, and whether the usage-only chunk is ours to drop."""
    if path in MULTIPART_PATHS:
        return body, False  # the upload goes as it came
    stream = payload.get("stream") is True and path in STREAMING_PATHS
    return rewrite_body(body, payload, route, stream and path in USAGE_OPTION_PATHS)
