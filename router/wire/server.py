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
import logging
import socket
import time
from collections import deque
from collections.abc import Callable, Coroutine
from email.utils import formatdate
from typing import Any
from urllib.parse import unquote

import httptools

from router.wire.cycle import Application, RequestCycle, plain_answer

logger = logging.getLogger(__name__)

# An application's way to answer a request from callbacks, before any task is made: True
# when it took the request (router/forward/express.py), False to have it answered in a task.
Expressway = Callable[[RequestCycle], bool]

# An upload past this many bytes unread pauses reading until the application takes it.
HIGH_WATER_BYTES = 64 * 1024
# A request's line and headers together; past this, 431 (nginx's large buffers: 4 x 8k).
MOST_HEAD_BYTES = 64 * 1024
# An idle keep-alive connection is closed after this long (uvicorn's default).
KEEP_ALIVE_SECONDS = 5.0
ASGI = {"version": "3.0", "spec_version": "2.3"}


class Clock:
    """The ``date`` header, made once a second for every answer (RFC 9110 asks for it)."""

    def __init__(self) -> None:
        self.date_header = b""
        self.tick()

    def tick(self) -> None:
        self.date_header = b"date: %s\r\n" % formatdate(usegmt=True).encode()


class Server:
    """What the connections of one listening socket share."""

    def __init__(self, app: Application, scheme: str = "http",
                 express: Expressway | None = None) -> None:  # fmt: skip
        self.app = app
        self.scheme = scheme
        self.express = express
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

    def busy(self) -> bool:
        """Whether an answer is under way, in a task or from callbacks."""
        return bool(self.tasks) or any(c.answering is not None for c in self.connections)

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
        self.unstarted: RequestCycle | None = None  # answering, its body not all here yet
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
        if self.unstarted is not None:  # its body comes later: answered in a task
            cycle, self.unstarted = self.unstarted, None
            self.start(cycle)

    def pause_writing(self) -> None:
        self.drained = asyncio.get_running_loop().create_future()
        if self.answering is not None and self.answering.express is not None:
            self.answering.express.client_paused()

    def resume_writing(self) -> None:
        if self.drained is not None and not self.drained.done():
            self.drained.set_result(None)
        self.drained = None
        if self.answering is not None and self.answering.express is not None:
            self.answering.express.client_resumed()

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
        if self.answering is None and self.server.express is not None and version != "1.0":
            self.answering = self.unstarted = cycle  # perhaps answered once its body is here
        elif self.answering is None:
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
            if cycle is self.unstarted:
                self.unstarted = None
                if not self.expressed(cycle):
                    self.start(cycle)

    def expressed(self, cycle: RequestCycle) -> bool:
        """Whether the application took ``cycle`` to answer from callbacks."""
        try:
            return self.server.express(cycle)  # type: ignore[misc]
        except Exception:
            logger.exception("The application's express way failed on %s %s",
                             cycle.scope["method"], cycle.scope["path"])  # fmt: skip
            return cycle.started  # half an answer is the application's to finish

    # -- answering ----------------------------------------------------------------------

    def start(self, cycle: RequestCycle) -> None:
        self.answering = cycle
        self.spawn(cycle.run(self.server.app))

    def spawn(self, answering: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(answering)
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
