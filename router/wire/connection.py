"""One keep-alive HTTP/1.1 connection to an engine, and the answer it carries.

The connection is an asyncio protocol fed by httptools' C parser; ``Response`` hands the
answer's body on as it arrives and pauses reading while a slow client has not taken
``HIGH_WATER`` of it. A connection carries one request at a time and, once its answer was
read whole, goes back to its pool (upstream.py) to carry the next; one whose answer was
abandoned is closed, which is how an engine learns that the client left.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import NamedTuple

import httptools

# Response headers the ASGI server sets itself, that describe the engine's hop, or that
# the router decides (CORS: llama-server answers every request with its own, router/intake/cors.py).
HOP_RESPONSE_HEADERS = frozenset(
    {
        b"connection", b"keep-alive", b"transfer-encoding", b"content-length", b"date",
        b"server", b"trailer", b"upgrade", b"access-control-allow-origin",
        b"access-control-allow-credentials", b"access-control-allow-methods",
        b"access-control-allow-headers", b"access-control-expose-headers",
        b"access-control-max-age", b"x-request-id",
    }
)  # fmt: skip

# Reading pauses while this much of an answer waits for a slow client.
HIGH_WATER = 256 * 1024
# A request's head and body go in one write below this (copying more costs more).
JOIN_BELOW_BYTES = 64 * 1024
# An engine whose host went silent (a cut link, a machine powered off) never closes its
# connections, and the read timeout is long (prefill of a long prompt). The host's kernel
# answers keepalive probes however busy the engine is, so no answer to 3 probes 2 s apart
# after 4 s idle (or 10 s without an acknowledgement of what was sent) means no host: the
# connection fails in about 10 s, and a request with no answer yet goes to another replica.
KEEPALIVE_OPTIONS = (
    (socket.IPPROTO_TCP, "TCP_KEEPIDLE", 4),
    (socket.IPPROTO_TCP, "TCP_KEEPINTVL", 2),
    (socket.IPPROTO_TCP, "TCP_KEEPCNT", 3),
    (socket.IPPROTO_TCP, "TCP_USER_TIMEOUT", 10_000),  # milliseconds
)


class Rest(NamedTuple):
    """An upload's rest, sent after its head as the client sends it: ``length`` is the
    whole body's (head included)."""

    chunks: AsyncIterator[bytes]
    length: int


class UpstreamBroken(Exception):
    """An answer began and then broke off (the engine died, or went silent too long).

    ``kind`` says how, for metrics and logs: "closed" (the engine closed or reset the
    connection), "silent" (no byte within the read timeout), "invalid" (not HTTP).
    """

    def __init__(self, detail: str, kind: str = "closed") -> None:
        super().__init__(detail)
        self.kind = kind


class Response:
    """An engine's answer: status and headers now, the body as it arrives."""

    def __init__(self, connection: EngineConnection) -> None:
        self._connection = connection
        self.status = 0
        self.raw_headers: list[tuple[bytes, bytes]] = []
        self._chunks: deque[bytes] = deque()
        self._buffered = 0
        self._waiter: asyncio.Future | None = None
        self._complete = False
        self._error: Exception | None = None
        self._released = False

    @property
    def is_event_stream(self) -> bool:
        for name, value in self.raw_headers:
            if name == b"content-type":
                return value.split(b";", 1)[0].strip().lower() == b"text/event-stream"
        return False

    def headers_for_client(self) -> list[tuple[bytes, bytes]]:
        return [(n, v) for n, v in self.raw_headers if n not in HOP_RESPONSE_HEADERS]

    async def chunks(self) -> AsyncIterator[bytes]:
        """Whatever has arrived, as soon as it has arrived, until the answer is whole."""
        while True:
            if self._chunks:
                chunks = self._chunks
                data = chunks.popleft() if len(chunks) == 1 else b"".join(chunks)
                chunks.clear()
                self._buffered = 0
                self._connection.resume()
                yield data
                continue
            if self._error is not None:
                raise self._error
            if self._complete:
                return
            self._waiter = self._connection.loop.create_future()
            await self._waiter

    async def read(self) -> bytes:
        parts = [data async for data in self.chunks()]
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def close(self) -> None:
        """Give the connection back if the answer was whole; otherwise hang up on the engine."""
        if not self._released:
            self._released = True
            self._connection.finished(self, whole=self._complete and not self._error)

    # Called by the connection (router/forward/express.py's answer overrides them).
    def _headed(self) -> None:
        """The status and headers are in (``request`` is told by its own future)."""

    def _fed(self) -> None:
        """What one read from the socket held has been fed (chunks, maybe the end)."""

    def _feed(self, data: bytes) -> None:
        self._chunks.append(data)
        self._buffered += len(data)
        if self._buffered > HIGH_WATER:
            self._connection.pause()
        self._wake()

    def _end(self, error: Exception | None = None) -> None:
        if error is not None:
            self._error = error
        else:
            self._complete = True
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)


class EngineConnection(asyncio.Protocol):
    """One keep-alive connection to an engine, carrying one request at a time."""

    def __init__(
        self, key: tuple, loop: asyncio.AbstractEventLoop, read_timeout: float,
        give_back: Callable[[EngineConnection, bool], None],
    ) -> None:  # fmt: skip
        """``give_back(connection, reusable)`` is the pool's, called once per request when
        its answer is closed: it frees the request's slot and keeps a reusable connection."""
        self.key = key
        self.loop = loop
        self.read_timeout = read_timeout
        self.give_back = give_back
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self.last_read = 0.0
        self.paused = False
        self.response: Response | None = None
        self.headers_done: asyncio.Future | None = None
        self.parser: httptools.HttpResponseParser | None = None
        self.framed = False  # the answer has a length or chunks (not ended by closing)
        self.keep_alive = False
        self.timer: asyncio.TimerHandle | None = None
        # Set while the transport's buffer is full (an upload faster than the engine reads).
        self.writable: asyncio.Future | None = None

    # -- asyncio.Protocol ----------------------------------------------------------------

    def connection_made(self, transport) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            give_up_on_silent_hosts(sock)

    def data_received(self, data: bytes) -> None:
        self.last_read = self.loop.time()
        if self.parser is None:
            self.abort()  # bytes nobody asked for on an idle connection
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(UpstreamBroken(f"the engine's answer is not valid HTTP: {exc}", "invalid"))
            self.abort()
            return
        if self.response is not None:
            self.response._fed()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._cancel_timer()
        response = self.response
        if response is None:
            return
        if response.status and not self.framed and not response._complete:
            response._end()  # an answer without a length ends when the connection does
            return
        self._fail(None)

    def pause_writing(self) -> None:
        # A whole body is already written; only an upload's rest waits for room.
        self.writable = self.loop.create_future()

    def resume_writing(self) -> None:
        if self.writable is not None and not self.writable.done():
            self.writable.set_result(None)
        self.writable = None

    # -- httptools callbacks ---------------------------------------------------------------
    # The parser calls these only while a request is out, so a response and a parser exist.

    def on_header(self, name: bytes, value: bytes) -> None:
        assert self.response is not None
        name = name.lower()
        if name == b"content-length" or (name == b"transfer-encoding" and b"chunked" in value):
            self.framed = True
        self.response.raw_headers.append((name, value))

    def on_headers_complete(self) -> None:
        assert self.response is not None and self.parser is not None
        self.response.status = self.parser.get_status_code()
        if self.headers_done is not None and not self.headers_done.done():
            self.headers_done.set_result(None)
        self.response._headed()

    def on_body(self, body: bytes) -> None:
        assert self.response is not None
        self.response._feed(body)

    def on_message_complete(self) -> None:
        assert self.response is not None and self.parser is not None
        self.keep_alive = self.parser.should_keep_alive()
        self._cancel_timer()
        self.response._end()

    # -- requests ------------------------------------------------------------------------

    def send(
        self, method: bytes, host: bytes, path: bytes, body: bytes, headers: bytes,
        response: Response, length: int | None = None,
    ) -> None:  # fmt: skip
        """Write a request whose answer ``response`` is told of; ``length``: the whole
        body's, when only its head is ``body`` (the caller sends the rest, then ``wait``s)."""
        self.response = response
        self.parser = httptools.HttpResponseParser(self)
        self.framed = self.keep_alive = False
        head = b"%s %s HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\n%s\r\n" % (
            method, path, host, len(body) if length is None else length, headers,
        )  # fmt: skip
        assert self.transport is not None, "send() on a connection not yet made"
        if len(body) < JOIN_BELOW_BYTES:  # one write: writelines costs a second
            self.transport.write(head + body)
        else:
            self.transport.writelines((head, body))
        if length is None:
            self.wait()

    def wait(self) -> None:
        """The request is out: the read timeout runs from here."""
        self.last_read = self.loop.time()
        self.timer = self.loop.call_at(self.last_read + self.read_timeout, self._on_timer)

    async def request(
        self, method: bytes, host: bytes, path: bytes, body: bytes, headers: bytes,
        rest: Rest | None = None,
    ) -> Response:  # fmt: skip
        response = Response(self)
        self.headers_done = self.loop.create_future()
        self.send(method, host, path, body, headers, response,
                  None if rest is None else rest.length)  # fmt: skip
        if rest is not None:
            try:
                await self._send_rest(rest.chunks)
            except BaseException:
                self.finished(response, whole=False)
                raise
            self.wait()
        try:
            await self.headers_done
        except BaseException:
            self.finished(response, whole=False)
            raise
        return response

    async def _send_rest(self, chunks: AsyncIterator[bytes]) -> None:
        """Write an upload's rest as the client sends it, as fast as the engine reads it."""
        assert self.transport is not None
        async for chunk in chunks:
            if self.closed:
                raise UpstreamBroken("the engine closed the connection during the upload")
            self.transport.write(chunk)
            if self.writable is not None:
                await self.writable

    def _on_timer(self) -> None:
        silent_until = self.last_read + self.read_timeout
        if self.loop.time() < silent_until:
            self.timer = self.loop.call_at(silent_until, self._on_timer)
            return
        self.timer = None
        self._fail(TimeoutError(f"no byte from the engine in {self.read_timeout:g} s"))
        self.abort()

    def _cancel_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _fail(self, error: Exception | None) -> None:
        """The connection broke: tell whoever waits, in the terms of where it broke."""
        if self.headers_done is not None and not self.headers_done.done():
            self.headers_done.set_exception(
                error if isinstance(error, TimeoutError | UpstreamBroken) else ConnectionError()
            )
        elif self.response is not None and not self.response._complete:
            if isinstance(error, UpstreamBroken):
                broken = error
            elif isinstance(error, TimeoutError):
                broken = UpstreamBroken(str(error), "silent")
            else:
                broken = UpstreamBroken("the engine closed the connection mid-answer")
            self.response._end(broken)

    def finished(self, response: Response, *, whole: bool) -> None:
        if response is not self.response:
            return
        self._cancel_timer()
        self.response = None
        self.parser = None
        self.headers_done = None
        self.resume()
        reusable = whole and self.keep_alive and not self.closed
        self.give_back(self, reusable)
        if not reusable:
            self.abort()

    def pause(self) -> None:
        if not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()

    def resume(self) -> None:
        if self.paused and self.transport is not None and not self.closed:
            self.paused = False
            self.last_read = self.loop.time()  # a slow client's pause is not engine silence
            self.transport.resume_reading()

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


def give_up_on_silent_hosts(sock) -> None:
    """Keepalive on an engine connection (``KEEPALIVE_OPTIONS``; those the OS lacks are skipped)."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for level, name, value in KEEPALIVE_OPTIONS:
        option = getattr(socket, name, None)
        if option is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(level, option, value)
