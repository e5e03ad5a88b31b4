"""Relaying an engine's answer to the client, and noticing when the client leaves.

Streams go out as the engine sends them: each read from the engine is passed on at
once (when a usage-only chunk must be dropped, only a partial event waits for its end).
A request still running after ``WATCH_AFTER_SECONDS`` gets a watcher for the client's
disconnect, which cancels the relay; leaving the relay closes the engine's connection,
and that is what stops the engine generating.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

from router import errors
from router.call import Call, Exchange, Receive
from router.metrics import RouterMetrics
from router.table import ModelRoute
from router.upstream import Response, UpstreamBroken
from router.usage import EventScanner, Tokens, usage_of_body

logger = logging.getLogger(__name__)

STREAM_HEADERS = [(b"x-accel-buffering", b"no"), (b"cache-control", b"no-cache")]
# A request still running after this long gets a task watching for the client to leave.
WATCH_AFTER_SECONDS = 0.05


def start_watching(call: Call, task: asyncio.Task) -> None:
    """Cancel ``task`` if the client leaves before the answer's last message goes out."""
    exchange = call.exchange
    if not exchange.finishing:
        exchange.watcher = asyncio.ensure_future(_watch_disconnect(call.receive, task, exchange))


async def _watch_disconnect(receive: Receive, task: asyncio.Task, exchange: Exchange) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
    if not exchange.finishing:
        exchange.client_gone = True
        task.cancel()


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
            payload["stream_options"] = {
                **(options if isinstance(options, dict) else {}),
                "include_usage": True,
            }
            drop_usage_only = changed = True
    if changed:
        body = json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode()
    return body, drop_usage_only


async def relay(
    call: Call, response: Response, replica: str, metrics: RouterMetrics
) -> tuple[bool, Tokens | None]:
    """Pass the engine's answer on; return whether it came whole, and its usage."""
    if response.is_event_stream:
        return await _relay_stream(call, response, replica, metrics)
    model = call.model
    try:
        data = await response.read()
    except UpstreamBroken as exc:
        metrics.upstream_error(model, replica, "broken_answer")
        raise errors.bad_gateway(f"An engine of {model} broke off its answer: {exc}.") from None
    headers = response.headers_for_client() + call.limit_headers
    headers.append((b"content-length", str(len(data)).encode()))
    call.exchange.finishing = True
    send = call.send
    await send({"type": "http.response.start", "status": response.status, "headers": headers})
    await send({"type": "http.response.body", "body": data})
    metrics.first_byte(model, time.perf_counter() - call.started)
    return True, usage_of_body(data) if response.status < 400 else None


async def _relay_stream(
    call: Call, response: Response, replica: str, metrics: RouterMetrics
) -> tuple[bool, Tokens | None]:
    model, send, drop_usage_only = call.model, call.send, call.drop_usage_only
    headers = response.headers_for_client() + STREAM_HEADERS + call.limit_headers
    await send({"type": "http.response.start", "status": response.status, "headers": headers})
    scanner = EventScanner(drop_usage_only=drop_usage_only)
    first = True
    whole = True
    try:
        # Whatever arrived, as soon as it arrived: no buffering here.
        async for data in response.chunks():
            out = scanner.feed(data)
            if not drop_usage_only:
                out = data  # nothing to drop: pass bytes on before events are whole
            if not out:
                continue
            await send({"type": "http.response.body", "body": out, "more_body": True})
            if first:
                metrics.first_byte(model, time.perf_counter() - call.started)
                first = False
        tail = scanner.flush() if drop_usage_only else b""
    except UpstreamBroken as exc:
        # After the first byte a failure is the client's to see, in words: a stream that
        # just stopped would read as a whole answer to many clients.
        logger.warning("stream from an engine of %s broke: %s", model, exc)
        metrics.upstream_error(model, replica, "broken_stream")
        tail = errors.stream_error_event(
            f"An engine of {model} broke off its answer after it began: {exc}; the answer "
            "is incomplete, send the request again."
        )
        if scanner.mid_event and not drop_usage_only:
            # Part of an event went out as it came: end it, or the error joins its data.
            tail = b"\n\n" + tail
        whole = False
    call.exchange.finishing = True
    await send({"type": "http.response.body", "body": tail, "more_body": False})
    return whole, scanner.tokens
