"""One request on the router's own server and its answer: ASGI's ``receive`` and ``send``,
or an answer given straight from the sockets' callbacks (``Express``).

The server (server.py) parses requests into cycles and hands each to the application in a
task; an application that can answer a request without waiting on anything but sockets
(router/forward/express.py) takes it before any task is made, writes its answer with
``start_answer`` and ``send_body`` from its own callbacks, and hands the rest over to a
task (``hand_over``) the moment it must wait on something else.
"""

from __future__ import annotations

import asyncio
import http
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol

logger = logging.getLogger("router.wire.server")

Application = Callable[[dict, Callable[[], Awaitable[dict]], Callable[[dict], Awaitable[None]]],
                       Awaitable[None]]  # fmt: skip

# Answers the head of which goes out with its body: below this, one write of both.
JOIN_BELOW_BYTES = 256 * 1024

DISCONNECT = {"type": "http.disconnect"}
STATUS_LINES = {
    status.value: b"HTTP/1.1 %d %s\r\n" % (status.value, status.phrase.encode())
    for status in http.HTTPStatus
}
NO_BODY_STATUSES = frozenset({204, 304})


def status_line(status: int) -> bytes:
    return STATUS_LINES.get(status) or b"HTTP/1.1 %d \r\n" % status


def plain_answer(status: int, text: str) -> bytes:
    """A whole answer the server gives itself, after which it closes the connection."""
    body = text.encode()
    head = b"content-type: text/plain; charset=utf-8\r\ncontent-length: %d\r\n" % len(body)
    return status_line(status) + head + b"connection: close\r\n\r\n" + body


class ClientConnection(Protocol):
    """What a cycle needs of the client's connection it came on (server.py's)."""

    transport: asyncio.Transport
    drained: asyncio.Future | None  # set while the client reads slower than it is written to
    server: Any  # its ``clock.date_header``

    def refuse(self, status: int, text: str) -> None: ...

    def answered(self, cycle: RequestCycle) -> None: ...

    def resume_reading(self) -> None: ...

    def spawn(self, answering: Coroutine[Any, Any, None]) -> None: ...


class Express(Protocol):
    """An answer being given from callbacks, told what its client does meanwhile."""

    def client_left(self) -> None: ...

    def client_paused(self) -> None: ...  # the client reads slower than the answer comes

    def client_resumed(self) -> None: ...


class RequestCycle:
    """One request and its answer: ASGI's ``receive`` and ``send`` for it."""

    __slots__ = ("connection", "scope", "keep_alive", "expects_continue", "body", "unread",
                 "complete", "delivered", "disconnected", "started", "finished", "chunked",
                 "no_body", "length_left", "head", "waiter", "express")  # fmt: skip

    def __init__(self, connection: ClientConnection, scope: dict, keep_alive: bool,
                 expects_continue: bool) -> None:  # fmt: skip
        self.connection = connection
        self.scope = scope
        self.keep_alive = keep_alive
        self.expects_continue = expects_continue
        self.body: list[bytes] = []  # arrived, not yet taken by ``receive``
        self.unread = 0
        self.complete = False  # the whole body has arrived
        self.delivered = False  # and was taken
        self.disconnected = False
        self.started = False  # the answer's head was given
        self.finished = False  # its last body message was sent
        self.chunked = False
        self.no_body = False  # HEAD, 204, 304
        self.length_left = -1  # bytes the content-length has left; -1: no length given
        self.head = b""  # the answer's head, held to go out with its body
        self.waiter: asyncio.Future | None = None
        self.express: Express | None = None  # answering from callbacks, not a task

    async def run(self, app: Application) -> None:
        await self.answer(app(self.scope, self.receive, self.send))

    def hand_over(self, answering: Awaitable[None]) -> None:
        """Go on answering in a task: what began in callbacks has to wait on something."""
        self.express = None
        self.connection.spawn(self.answer(answering))

    async def answer(self, answering: Awaitable[None]) -> None:
        try:
            await answering
        except asyncio.CancelledError:  # a stop past its grace: cut, not a failure to report
            self.connection.transport.close()
            raise
        except BaseException as exc:
            logger.error("The application failed on %s %s", self.scope["method"],
                         self.scope["path"], exc_info=exc)  # fmt: skip
            if not self.started and not self.disconnected:
                self.connection.refuse(500, "Internal Server Error")
            else:
                self.connection.transport.close()
            if not isinstance(exc, Exception):
                raise
            return
        if self.disconnected or self.finished:
            return
        if not self.started:
            logger.error("The application answered nothing to %s %s", self.scope["method"],
                         self.scope["path"])  # fmt: skip
            self.connection.refuse(500, "Internal Server Error")
        else:  # a half-sent answer cannot be mended: the client sees it cut off
            logger.error("The application left its answer to %s %s unfinished",
                         self.scope["method"], self.scope["path"])  # fmt: skip
            self.connection.transport.close()

    def wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def lost(self) -> None:
        self.disconnected = True
        self.wake()
        if self.express is not None:
            self.express.client_left()

    async def receive(self) -> dict:
        if self.expects_continue:
            self.expects_continue = False
            if not self.started and not self.disconnected:
                self.connection.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        while True:
            if self.disconnected or self.finished:
                return DISCONNECT
            if self.body or (self.complete and not self.delivered):
                body = self.body[0] if len(self.body) == 1 else b"".join(self.body)
                self.body.clear()
                self.unread = 0
                self.connection.resume_reading()
                self.delivered = self.complete
                return {"type": "http.request", "body": body, "more_body": not self.complete}
            self.waiter = asyncio.get_running_loop().create_future()
            try:
                await self.waiter
            finally:
                self.waiter = None

    async def send(self, message: dict) -> None:
        connection = self.connection
        if connection.drained is not None and not self.disconnected:
            await connection.drained
        if self.disconnected or connection.transport.is_closing():
            return
        if not self.started:
            if message["type"] != "http.response.start":
                raise RuntimeError(f"expected http.response.start, got {message['type']}")
            self.start_answer(message["status"], message.get("headers", ()))
        elif not self.finished:
            if message["type"] != "http.response.body":
                raise RuntimeError(f"expected http.response.body, got {message['type']}")
            self.send_body(message.get("body", b""), message.get("more_body", False))
        else:
            raise RuntimeError(f"{message['type']} after the answer was complete")

    def start_answer(self, status: int, headers: Any) -> None:
        parts = [status_line(status), self.connection.server.clock.date_header]
        length: int | None = None
        closes = False
        for name, value in headers:
            # A CR or LF in a header would let whoever chose it write headers of their own.
            if b"\n" in value or b"\r" in value or b"\n" in name or b"\r" in name or b":" in name:
                raise RuntimeError(f"header {name!r} has a line break or colon in it")
            name = name.lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"transfer-encoding":
                self.chunked = value.lower() == b"chunked"
            elif name == b"connection" and b"close" in value.lower():
                self.keep_alive, closes = False, True
            parts += (name, b": ", value, b"\r\n")
        self.started = True
        self.expects_continue = False
        self.no_body = self.scope["method"] == "HEAD" or status in NO_BODY_STATUSES
        if length is not None:
            self.length_left = length
        elif self.no_body or self.chunked:
            pass
        elif self.scope["http_version"] == "1.0":
            self.keep_alive = False  # HTTP/1.0 has no chunks: the body ends with the connection
        else:
            self.chunked = True
            parts.append(b"transfer-encoding: chunked\r\n")
        if not self.keep_alive and not closes:
            parts.append(b"connection: close\r\n")
        parts.append(b"\r\n")
        self.head = b"".join(parts)
        if length is None or self.no_body:
            # A stream's head goes out with its first events when they come in this turn of
            # the loop (they mostly come with the engine's head: a write a stream saved),
            # and at the turn's end when they do not.
            asyncio.get_running_loop().call_soon(self.write_head)

    def write_head(self) -> None:
        head, self.head = self.head, b""
        if head and not self.disconnected:
            self.connection.transport.write(head)

    def send_body(self, body: bytes, more: bool) -> None:
        if self.no_body:
            data = b""
        elif self.chunked:
            data = b"%x\r\n%b\r\n" % (len(body), body) if body else b""
            if not more:
                data += b"0\r\n\r\n"
        elif self.length_left >= 0:
            self.length_left -= len(body)
            if self.length_left < 0:
                raise RuntimeError("the answer is longer than its content-length")
            data = body
        else:  # HTTP/1.0 without a length: until the connection closes
            data = body
        head, self.head = self.head, b""
        transport = self.connection.transport
        if head:
            if len(data) < JOIN_BELOW_BYTES:
                data = head + data
            else:
                transport.write(head)
        if data:
            transport.write(data)
        if not more:
            if self.length_left > 0 and not self.no_body:
                raise RuntimeError("the answer is shorter than its content-length")
            self.finished = True
            self.wake()
            self.connection.answered(self)
