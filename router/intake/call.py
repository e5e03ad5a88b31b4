"""One inference request as the router carries it, and the steps that read it off the wire.

``Call`` holds what every step after parsing needs (the route, the body for the engine,
the headers to forward, who is asking, the client's ASGI channels); the proxy and the
relay take it whole instead of a dozen loose arguments. The readers here raise the
``RouterError`` a client should see, in the order the router checks them.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from router import errors
from router.conversations.chains import Chain
from router.table.adapters import body_for, needs_rewrite
from router.table.keys import Caller
from router.table.routes import Endpoint, ModelRoute, RoutingTable
from router.translate.plan import Translation
from router.wire.compact_json import compact_json

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

# Status reported for a client that hung up before its answer was whole (nginx's 499).
CLIENT_CLOSED = 499


@dataclass
class Exchange:
    """One request's relay, as the disconnect watcher sees it."""

    finishing: bool = False  # the last body message is going out; a disconnect is moot
    client_gone: bool = False
    watcher: asyncio.Task | None = None


class ClientLeft(Exception):
    """The client hung up while its upload was going through (not an engine's fault)."""


@dataclass
class Upload:
    """What was read of an upload to route it, and the way to the rest of it."""

    head: bytes
    receive: Receive
    length: int  # the whole body, as its Content-Length said
    started: bool = False  # the rest began to go out: no other replica can be asked

    async def rest(self) -> AsyncIterator[bytes]:
        """The body after ``head``, as the client sends it."""
        self.started = True
        remaining = self.length - len(self.head)
        while remaining > 0:
            message = await self.receive()
            if message["type"] == "http.disconnect":
                raise ClientLeft("the client hung up during its upload")
            chunk = message.get("body", b"")
            remaining -= len(chunk)
            if chunk:
                yield chunk
            if not message.get("more_body"):
                break


@dataclass(slots=True)
class Call:
    """A request that passed every check, on its way to a replica of ``route``."""

    receive: Receive
    send: Send
    path: str
    route: ModelRoute
    body: bytes  # as the engine gets it (see rewrite_body)
    headers: list[tuple[bytes, bytes]]  # the client's, less those of its hop
    caller: Caller
    session: str | None  # x-session-id, for affinity
    drop_usage_only: bool  # the usage chunk was asked for by us, not by the client
    started: float  # time.perf_counter() when the request arrived
    limit_headers: list[tuple[bytes, bytes]] = field(default_factory=list)  # x-ratelimit-*
    tokens_spent: int = 0  # prompt and completion, once the answer is whole
    exchange: Exchange = field(default_factory=Exchange)
    kind: str | None = None  # what the path asks of the model (protocol.serving); None: any
    # A Messages or Responses request, served on chat completions where the engine lacks it.
    translation: Translation | None = None
    query: bytes = b""  # the client's query string, passed on (Claude Code sends ?beta=true)
    upload: Upload | None = None  # an upload's rest, streamed to the engine (body: its head)
    chain: Chain | None = None  # a Responses conversation the router keeps the answer of

    @property
    def model(self) -> str:
        return self.route.name

    @property
    def upload_sent(self) -> bool:
        """Whether an upload's rest went to a replica already: it cannot be sent again."""
        return self.upload is not None and self.upload.started

    def not_again(self, failure: Exception, what: str) -> None:
        """Refuse to ask another replica for an upload whose rest went to the one that
        failed: the client's bytes are gone, and asking for them again would wait for ever."""
        if self.upload_sent:
            raise errors.bad_gateway(
                f"The replica of {self.model} that was sent the upload {what} it ({failure}); "
                "an upload streams through the router and cannot be sent to another replica: "
                "send it again."
            )

    def request_for(self, endpoint: Endpoint) -> tuple[str, bytes, Translation | None]:
        """The path and body ``endpoint``'s engine is sent, and the translation its answer
        needs (None: relayed as it comes)."""
        translation = self.translation
        if translation is not None and translation.applies_to(endpoint):
            path, body = translation.engine_request()
            return path, self.for_replica(body, endpoint), translation
        path = self.path
        if self.query:
            path = f"{path}?{self.query.decode('latin-1')}"
        return path, self.for_replica(self.body, endpoint), None

    def for_replica(self, body: bytes, endpoint: Endpoint) -> bytes:
        """``body`` naming the LoRA adapters ``endpoint`` must apply, by its own ids: they
        differ from replica to replica (router/table/adapters.py)."""
        if self.upload is not None or not needs_rewrite(self.route, endpoint):
            return body  # an upload goes as it came
        return body_for(body, self.route, endpoint)


async def read_body(receive: Receive, content_length: bytes | None, limit: int) -> bytes | None:
    """The whole body, or None when the client left first; 413 past ``limit`` bytes."""
    if content_length is not None:
        try:
            declared = int(content_length)
        except ValueError:
            raise errors.malformed(
                "Content-Length is not a number.", "invalid_content_length"
            ) from None
        if declared > limit:
            raise errors.too_large(limit)
    parts: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        part = message.get("body", b"")
        size += len(part)
        if size > limit:
            raise errors.too_large(limit)
        parts.append(part)
        if not message.get("more_body"):
            return parts[0] if len(parts) == 1 else b"".join(parts)


# Closes a JSON object (the body, less its last brace) asking for a stream's usage.
USAGE_OPTION = b',"stream_options":{"include_usage":true}}'


def rewrite_body(
    body: bytes, payload: dict[str, Any], route: ModelRoute, stream: bool
) -> tuple[bytes, bool]:
    """The body for the engine, and whether to drop the usage chunk we asked for.

    The engine serves the model under its catalog name, so an alias is replaced by it;
    a stream asks for usage (for accounting) even when the client did not. Otherwise
    the client's bytes go out untouched.
    """
    changed = False
    if payload["model"] != route.name:
        payload["model"] = route.name
        changed = True
    drop_usage_only = False
    if stream:
        options = payload.get("stream_options")
        if not (isinstance(options, dict) and options.get("include_usage") is True):
            drop_usage_only = True
            if options is None and not changed and "stream_options" not in payload:
                # The usual stream: the option added to the client's bytes, not the whole
                # body encoded again (a long conversation took a millisecond to encode).
                return body.rstrip()[:-1] + USAGE_OPTION, True
            payload["stream_options"] = {
                **(options if isinstance(options, dict) else {}),
                "include_usage": True,
            }
            changed = True
    if changed:
        body = compact_json(payload)
    return body, drop_usage_only


def resolve(table: RoutingTable, body: bytes, caller: Caller) -> tuple[ModelRoute, dict[str, Any]]:
    """The route the body's ``model`` names and the parsed body; 400, 404 or 403 if none."""
    try:
        payload = json.loads(body)
    except ValueError as exc:
        raise errors.malformed(f"The body is not valid JSON: {exc}.", "invalid_json") from None
    except RecursionError:  # the parser's own limit, reached by nesting alone
        raise errors.malformed(
            "The body is nested too deeply to be read.", "invalid_json"
        ) from None
    if not isinstance(payload, dict):
        raise errors.malformed("The body must be a JSON object.", "invalid_json")
    model = payload.get("model")
    if not isinstance(model, str) or not model:
        raise errors.malformed(
            "The body has no `model`; known models: "
            + (", ".join(visible_models(table, caller)) or "none yet")
            + ".",
            "missing_model",
        )
    route = table.by_name.get(model)
    if route is None or not caller.sees(route.names):  # closed to its team: not there for it
        raise errors.unknown_model(model, visible_models(table, caller))
    if not caller.may_use(route.names):
        raise errors.model_not_allowed(model, caller.name, sorted(caller.models))
    return route, payload


def visible_models(table: RoutingTable, caller: Caller) -> list[str]:
    """The models ``caller`` may use, by name, for a 404 that says what exists."""
    return [name for name, r in sorted(table.routes.items()) if caller.may_use(r.names)]
