"""Relaying an engine's answer to the client, and noticing when the client leaves.

Streams go out as the engine sends them: each whole event is passed on as soon as it
has arrived (only a partial event waits for its end, so that a stream broken off
mid-event can still be carried on by another engine, proxy.py). A request still running
after ``WATCH_AFTER_SECONDS`` gets a watcher for the client's disconnect, which cancels
the relay; leaving the relay closes the engine's connection, and that is what stops the
engine generating.

On the way an answer is edited for the client: translated back to its API when the
engine was asked in chat completions, an engine's error put in the shape of the client's
API, and a Responses answer's id noted for the requests that continue it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from typing import NamedTuple

from router import errors
from router.balance.response_ids import ResponseIds
from router.forward.migration import Relayed
from router.intake.call import Call, Exchange, Receive
from router.metrics import RouterMetrics
from router.translate import messages
from router.translate.plan import EventTranslator, Translation
from router.wire.connection import Response, UpstreamBroken
from router.wire.tokens import EventScanner, Tokens, usage_of_body

logger = logging.getLogger(__name__)

JSON_TYPE = [(b"content-type", b"application/json")]
STREAM_HEADERS = [(b"x-accel-buffering", b"no"), (b"cache-control", b"no-cache")]
# A request still running after this long gets a task watching for the client to leave.
WATCH_AFTER_SECONDS = 0.05
RESPONSES_PATH = "/v1/responses"


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


async def relay_body(
    call: Call, response: Response, metrics: RouterMetrics,
    edit: Callable[[int, bytes], tuple[int, bytes]] | None = None,
) -> Tokens | None:  # fmt: skip
    """Pass on an answer that does not stream, once it is whole (through ``edit``, which
    may translate it); return its usage, as the engine counted it.

    Raises UpstreamBroken when the engine broke off before the end: nothing reached the
    client, so the proxy may ask another replica.
    """
    data = await response.read()
    tokens = usage_of_body(data) if response.status < 400 else None
    status = response.status
    headers = response.headers_for_client()
    if edit is not None:
        status, edited = edit(status, data)
        if edited is not data:
            data = edited
            headers = [(n, v) for n, v in headers if n != b"content-type"] + JSON_TYPE
    headers += call.limit_headers
    headers.append((b"content-length", str(len(data)).encode()))
    call.exchange.finishing = True
    send = call.send
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})
    metrics.first_byte(call.model, time.perf_counter() - call.started)
    return tokens


def normalized_error(status: int, data: bytes, path: str = "") -> tuple[int, bytes]:
    """An engine's error as the client's API shapes errors, with a string ``code``.

    Engines differ: llama-server's ``code`` is the HTTP status as a number, which the
    OpenAI SDK takes for a server error; its 501 for an endpoint it was not started
    with is the client's 400 (the model does not serve that here).
    """
    if status == 501:
        status = 400
    try:
        answer = json.loads(data)
    except ValueError:
        answer = None
    if path.startswith("/v1/messages"):
        if isinstance(answer, dict) and answer.get("type") == "error":
            return status, data  # already Anthropic's shape
        return status, messages.error_body(status, data)
    error = answer.get("error") if isinstance(answer, dict) else None
    if isinstance(error, dict) and isinstance(error.get("code"), str):
        return status, data
    if isinstance(error, dict):
        message = str(error.get("message") or "")
        kind = error.get("type") if isinstance(error.get("type"), str) else None
    else:
        message = data[:2000].decode("utf-8", "replace").strip()
        kind = None
    code = kind or f"http_{status}"
    type_ = "invalid_request_error" if status < 500 else "upstream_error"
    message = message or f"The engine answered HTTP {status} without saying why."
    return status, errors.error_body(message, type_, code)


def answer_editor(
    call: Call, translation: Translation | None, replica: str, response_ids: ResponseIds
) -> Callable[[int, bytes], tuple[int, bytes]]:
    """What a whole answer becomes for the client: translated back to the client's API,
    or an engine's error put in the shape of the client's API; a Responses answer's
    id is noted, and its conversation kept where the router keeps it, for the requests
    that continue it."""

    def edit(status: int, data: bytes) -> tuple[int, bytes]:
        if translation is not None:
            status = 400 if status == 501 else status
            data = translation.answer(status, data)
        elif status >= 400:
            return normalized_error(status, data, call.path)
        elif call.path == RESPONSES_PATH and call.chain is None:
            response_ids.note_answer(data, replica, call.model, call.caller.owner)  # engine's
        if call.chain is not None and status == 200:
            call.chain.keep_answer(data)  # ours, kept before the client has it
        return status, data

    return edit


def noting_response_id(
    edit: Callable[[bytes], bytes], response_ids: ResponseIds, replica: str, model: str,
    owner: str,
) -> Callable[[bytes], bytes]:  # fmt: skip
    """``edit``, noting the response's id (made for ``owner``) from the first event that
    names one."""
    noted = False

    def noting(data: bytes) -> bytes:
        nonlocal noted
        events = edit(data)
        if not noted and b"resp_" in events:
            response_ids.note_answer(events, replica, model, owner)
            noted = True
        return events

    return noting


def translated(
    scanner: EventScanner, events: EventTranslator
) -> tuple[Callable[[bytes], bytes], Callable[[], bytes]]:
    """The scanner (which counts the chat completion's usage) and then the translation."""

    def edit(data: bytes) -> bytes:
        return events.feed(scanner.feed(data))

    def flush() -> bytes:
        return events.feed(scanner.flush()) + events.flush()

    return edit, flush


class StreamRelay:
    """One client's stream, relayed from one engine and, when it breaks off, from the next.

    Only whole events go out, so a stream can be ended or carried on at any break
    without a half event reaching the client. Each event sent is kept (migration.Relayed)
    to know what the client has.
    """

    def __init__(self, call: Call, metrics: RouterMetrics, relayed: Relayed | None = None) -> None:
        """``relayed``: what of a stream begun elsewhere (express.py) reached the client."""
        self.call = call
        self.metrics = metrics
        self.relayed = relayed or Relayed()
        self._first = relayed is None

    async def begin(self, response: Response) -> None:
        """Send the status and headers: the first engine's, whichever engines follow."""
        headers = response.headers_for_client() + STREAM_HEADERS + self.call.limit_headers
        await self.call.send(
            {"type": "http.response.start", "status": response.status, "headers": headers}
        )

    async def pipe(
        self, response: Response, edit: Callable[[bytes], bytes], flush: Callable[[], bytes]
    ) -> UpstreamBroken | None:
        """Relay ``response``'s events through ``edit``, each as soon as it is whole; return
        how the engine broke off, or None when its answer came whole."""
        try:
            # Each event as soon as it is whole: no buffering beyond that.
            async for data in response.chunks():
                await self._send(edit(data))
            await self._send(flush())
        except UpstreamBroken as exc:
            return exc
        return None

    async def _send(self, events: bytes) -> None:
        if not events:
            return
        self.relayed.keep(events)
        await self.call.send({"type": "http.response.body", "body": events, "more_body": True})
        if self._first:
            self.metrics.first_byte(self.call.model, time.perf_counter() - self.call.started)
            self._first = False

    async def end(self, tail: bytes = b"") -> None:
        """Send the last bytes; a disconnect after this is moot."""
        self.call.exchange.finishing = True
        await self.call.send({"type": "http.response.body", "body": tail, "more_body": False})

    async def end_broken(
        self, broken: UpstreamBroken, why_not_moved: str,
        error_event: Callable[[str], bytes] = errors.stream_error_event,
    ) -> None:  # fmt: skip
        """End with the error event (``error_event`` makes it in the client's API's
        events): a stream that just stopped would read as a whole answer to many clients."""
        model = self.call.model
        logger.warning("stream from an engine of %s broke: %s; not moved: %s", model, broken,
                       why_not_moved)  # fmt: skip
        await self.end(
            error_event(
                f"An engine of {model} broke off its answer after it began: {broken}; the "
                f"answer is incomplete (not carried on elsewhere: {why_not_moved}), send the "
                "request again."
            )
        )


class BrokenStream(NamedTuple):
    """A stream whose engine broke off: the client's side of it, how, and any usage seen."""

    stream: StreamRelay
    broken: UpstreamBroken
    usage: Tokens | None
