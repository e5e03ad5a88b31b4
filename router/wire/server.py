"""The router's own HTTP/1.1 server: ASGI's ``http`` scope on httptools, no more.

uvicorn served the router until issue 45, and with everything else taken out its request
cycle and the event loop were about half the CPU an answer (bench/README.md, "the second
round"). Per request it built a scope of eleven keys and a state copy, an asyncio.Event
for the body, a keep-alive timer armed and cancelled, a task, two regular expressions a
header, and wrote an answer's head and body in two writes. Here a request whose body came
with its head is handed over without waiting on anything, an answer's head goes out in the
same write as its body (a stream's, with its first events when they come in the same turn
of the loop), idle connections are swept once a second instead of each arming a timer, and
a header is checked with two byte searches.

What a client relies on stays: keep-alive (HTTP/1.0 too, when asked), pipelined requests
answered in order, chunked bodies both ways, ``Expect: 100-continue`` (uploads), HEAD,
204 and 304 without a body, back-pressure both ways (a slow client pauses the answer's
writer; a large upload pauses reading until the application takes it), 400 for what does
not parse and 431 for a head past MOST_HEAD_BYTES, 500 when the application fails before
answering, and ``http.disconnect`` to a ``receive`` waiting when the client leaves.
Serving it (the socket, TLS, lifespan, signals, a graceful stop) is ``router.wire.serving``.
"""

from __future__ import annotations

import asyncio
import http
import logging
import socket
import time
from collections import deque
from collections.abc import Awaitable, Callable
from email.utils import formatdate
from typing import Any
from urllib.parse import unquote

import httptools

logger = logging.getLogger(__name__)

Application = Callable[[dict, Callable[[], Awaitable[dict]], Callable[[dict], Awaitable[None]]],
                       Awaitable[None]]  # fmt: skip

# An upload past this many bytes unread pauses reading until the application takes it.
HIGH_WATER_BYTES = 64 * 1024
# A request's line and headers together; past this, 431 (nginx's large buffers: 4 x 8k).
MOST_HEAD_BYTES = 64 * 1024
# An idle keep-alive connection is closed after this long (uvicorn's default).
KEEP_ALIVE_SECONDS = 5.0
# Answers the head of which goes out with its body: below this, one write of both.
JOIN_BELOW_BYTES = 256 * 1024

ASGI = {"version": "3.0", "spec_version": "2.3"}
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


class Clock:
    """The ``date`` header, made once a second for every answer (RFC 9110 asks for it)."""

    def __init__(self) -> None:
        self.date_header = b""
        self.tick()

    def tick(self) -> None:
        self.date_header = b"date: %s\r\n" % formatdate(usegmt=True).encode()


class Server:
    """What the connections of one listening socket share."""

    def __init__(self, app: Application, scheme: str = "http") -> None:
        self.app = app
        self.scheme = scheme
        self.clock = Clock()
        self.connections: set[Connection] = set()
        self.tasks: set[asyncio.Task] = set()
        self.stopping = False

    def connection(self) -> Connection:
        return Connection(self)

    def sweep(self) -> None:
        """Once a second: the date, and idle keep-alive connections closed."""
        self.clock.tick()
        deadline = time.monotonic() - KEEP_ALIVE_SECONDS
        for connection in list(self.connections):
            if connection.answering is None and connection.idle_since < deadline:
                connection.transport.close()

    def stop_accepting(self) -> None:
        """A stop: idle connections closed now, busy ones after their answer."""
        self.stopping = True
        for connection in list(self.connections):
            if connection.answering is None:
                connection.transport.close()
            else:
                connection.answering.keep_alive = False


class Connection(asyncio.Protocol):
    """One client's connection: its parser, the request being answered, those queued."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport = None  # type: ignore[assignment]
        self.address: tuple[Any, Any] = (None, None)  # the server's, the client's
        self.parsing: RequestCycle | None = None  # the request the parser is in
        self.answering: RequestCycle | None = None  # the request being answered
        self.queued: deque[RequestCycle] = deque()  # pipelined, answered in turn
        self.idle_since = time.monotonic()
        self.reading_paused = False
        self.drained: asyncio.Future | None = None  # set while the client reads slower
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.head_bytes = 0
        self.expects_continue = False

    # -- the transport's side ----------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            # Small answers must not wait on the client's delayed ACK (Nagle: 40 ms).
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.address = (transport.get_extra_info("sockname"), transport.get_extra_info("peername"))
        self.server.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connections.discard(self)
        for cycle in (self.answering, self.parsing, *self.queued):
            if cycle is not None:
                cycle.lost()
        if self.drained is not None and not self.drained.done():
            self.drained.set_result(None)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            pass  # no upgrade served: the request is answered as HTTP/1.1 (as uvicorn does)
        except httptools.HttpParserError as exc:
            if self.head_bytes > MOST_HEAD_BYTES:
                self.refuse(431, f"The request's line and headers are over {MOST_HEAD_BYTES} "
                            "bytes; send less in headers (a body has no such limit).")  # fmt: skip
            else:
                self.refuse(400, f"Invalid HTTP request: {exc}")

    def pause_writing(self) -> None:
        self.drained = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self.drained is not None and not self.drained.done():
            self.drained.set_result(None)
        self.drained = None

    def refuse(self, status: int, text: str) -> None:
        """Answer a request the server cannot hand on, and close (nothing after it can be
        read in step)."""
        if self.answering is None or not self.answering.started:
            self.transport.write(plain_answer(status, text))
        self.transport.close()

    # -- the parser's callbacks ---------------------------------------------------------

    def on_message_begin(self) -> None:
        self.url = b""
        self.headers = []
        self.head_bytes = 0
        self.expects_continue = False

    def on_url(self, url: bytes) -> None:
        self.url += url
        self.head_bytes += len(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self.head_bytes += len(name) + len(value)
        if self.head_bytes > MOST_HEAD_BYTES:
            raise httptools.HttpParserError("the head is too large")
        name = name.lower()
        value = value.rstrip(b" \t")  # llhttp keeps trailing whitespace (RFC 9110 5.5)
        if name == b"expect" and value.lower() == b"100-continue":
            self.expects_continue = True
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        parser = self.parser
        url = httptools.parse_url(self.url)
        raw_path = url.path
        path = raw_path.decode("ascii", "replace")
        if "%" in path:
            path = unquote(path)
        version = parser.get_http_version()
        scope = {
            "type": "http", "asgi": ASGI, "http_version": version,
            "method": parser.get_method().decode("ascii"), "scheme": self.server.scheme,
            "path": path, "raw_path": raw_path, "query_string": url.query or b"",
            "root_path": "", "headers": self.headers,
            "server": self.address[0], "client": self.address[1],
        }  # fmt: skip
        keep_alive = parser.should_keep_alive() and not self.server.stopping
        cycle = RequestCycle(self, scope, keep_alive, self.expects_continue)
        self.parsing = cycle
        if self.answering is None:
            self.start(cycle)
        else:  # pipelined: answered after the one before it; read no further meanwhile
            self.queued.append(cycle)
            self.pause_reading()

    def on_body(self, body: bytes) -> None:
        cycle = self.parsing
        if cycle is None or cycle.finished:
            return  # answered without reading it: dropped, so the next request can parse
        cycle.body.append(body)
        cycle.unread += len(body)
        if cycle.unread > HIGH_WATER_BYTES:
            self.pause_reading()
        cycle.wake()

    def on_message_complete(self) -> None:
        cycle, self.parsing = self.parsing, None
        if cycle is not None:
            cycle.complete = True
            cycle.wake()

    # -- answering ----------------------------------------------------------------------

    def start(self, cycle: RequestCycle) -> None:
        self.answering = cycle
        task = asyncio.get_running_loop().create_task(cycle.run(self.server.app))
        tasks = self.server.tasks
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    def answered(self, cycle: RequestCycle) -> None:
        """``cycle``'s answer is out: the next pipelined request, or idle until one comes."""
        self.answering = None
        if not cycle.keep_alive:
            self.transport.close()
            return
        if self.queued:
            self.start(self.queued.popleft())
            if not self.queued:
                self.resume_reading()
            return
        self.idle_since = time.monotonic()
        self.resume_reading()

    def pause_reading(self) -> None:
        if not self.reading_paused:
            self.reading_paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.reading_paused and not self.queued:
            self.reading_paused = False
            self.transport.resume_reading()


class RequestCycle:
    """One request and its answer: ASGI's ``receive`` and ``send`` for it."""

    __slots__ = ("connection", "scope", "keep_alive", "expects_continue", "body", "unread",
                 "complete", "delivered", "disconnected", "started", "finished", "chunked",
                 "no_body", "length_left", "head", "waiter")  # fmt: skip

    def __init__(self, connection: Connection, scope: dict, keep_alive: bool,
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

    async def run(self, app: Application) -> None:
        try:
            await app(self.scope, self.receive, self.send)
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
