"""The router's one way out: HTTP/1.1 to engines, with timeouts and pooled connections.

A small client on asyncio's transports and httptools' C parser rather than a general
library: the router does one thing (POST a body, relay the answer) and its throughput
is bounded by CPU per request. On this project's 2-core machine it costs about half of
aiohttp's CPU per request, which bench/router_overhead.py shows as throughput
(``--routers uvicorn+lean,uvicorn+aiohttp``; bench/aiohttp_upstream.py is the one
measured against). httpx was not a candidate: GPUStack measured its proxy at a third of
direct throughput with httpx.

What it does, and nothing more: keep-alive pools per engine address; a connect
timeout; a read timeout on silence, not on total time (a long generation is not a
fault); TCP keepalive, so that an engine whose host went silent is given up in
seconds; back-pressure (reading from an engine pauses while a slow client has not
taken what was read); and closing the engine connection when the relay is abandoned, which
is how an engine learns that the client left and stops generating.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections import deque
from collections.abc import AsyncIterator
from typing import NamedTuple
from urllib.parse import urlsplit

import httptools

# Request headers that describe this hop, not the request; never forwarded.
HOP_REQUEST_HEADERS = frozenset(
    {
        b"authorization", b"host", b"content-length", b"connection", b"keep-alive",
        b"transfer-encoding", b"te", b"trailer", b"upgrade", b"proxy-authorization",
        b"proxy-connection", b"accept-encoding", b"expect",
    }
)  # fmt: skip
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

# Idle connections are dropped after this, under llama-server's 5 s keep-alive, so the
# engine never closes a connection just as a request goes out on it.
KEEPALIVE_SECONDS = 4.0
# Reading pauses while this much of an answer waits for a slow client.
HIGH_WATER = 256 * 1024
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


class UpstreamUnreachable(Exception):
    """No answer began: connect refused or timed out, or the engine hung up first."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(detail)
        self.kind = kind


class UpstreamBroken(Exception):
    """An answer began and then broke off (the engine died, or went silent too long).

    ``kind`` says how, for metrics and logs: "closed" (the engine closed or reset the
    connection), "silent" (no byte within the read timeout), "invalid" (not HTTP).
    """

    def __init__(self, detail: str, kind: str = "closed") -> None:
        super().__init__(detail)
        self.kind = kind


class _Target:
    """An engine address, parsed once."""

    __slots__ = ("host", "port", "ssl", "host_header", "key", "prefix")

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{url!r} is not an http(s) URL")
        self.ssl = parts.scheme == "https"
        self.host = parts.hostname
        self.port = parts.port or (443 if self.ssl else 80)
        self.host_header = parts.netloc.encode()
        self.key = (self.host, self.port, self.ssl)
        self.prefix = parts.path.rstrip("/")  # an engine behind a path: http://gw/vllm-a


class Response:
    """An engine's answer: status and headers now, the body as it arrives."""

    def __init__(self, connection: _Connection) -> None:
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

    # Called by the connection.
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


class _Connection(asyncio.Protocol):
    """One keep-alive connection to an engine, carrying one request at a time."""

    def __init__(self, pool: Upstream, key: tuple) -> None:
        self.pool = pool
        self.key = key
        self.loop = pool.loop
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

    def on_body(self, body: bytes) -> None:
        assert self.response is not None
        self.response._feed(body)

    def on_message_complete(self) -> None:
        assert self.response is not None and self.parser is not None
        self.keep_alive = self.parser.should_keep_alive()
        self._cancel_timer()
        self.response._end()

    # -- requests ------------------------------------------------------------------------

    async def request(
        self, method: bytes, target: _Target, path: bytes, body: bytes, headers: bytes,
        rest: Rest | None = None,
    ) -> Response:  # fmt: skip
        response = self.response = Response(self)
        self.parser = httptools.HttpResponseParser(self)
        self.framed = self.keep_alive = False
        self.headers_done = self.loop.create_future()
        length = len(body) if rest is None else rest.length
        head = b"%s %s HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\n%s\r\n" % (
            method, path, target.host_header, length, headers,
        )  # fmt: skip
        assert self.transport is not None, "request() on a connection not yet made"
        self.transport.writelines((head, body))
        if rest is not None:
            try:
                await self._send_rest(rest.chunks)
            except BaseException:
                self.finished(response, whole=False)
                raise
        self.last_read = self.loop.time()
        self.timer = self.loop.call_at(self.last_read + self.pool.read_timeout, self._on_timer)
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
        silent_until = self.last_read + self.pool.read_timeout
        if self.loop.time() < silent_until:
            self.timer = self.loop.call_at(silent_until, self._on_timer)
            return
        self.timer = None
        self._fail(TimeoutError(f"no byte from the engine in {self.pool.read_timeout:g} s"))
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
        assert self.pool._slots is not None
        self.pool._slots.release()
        self._cancel_timer()
        self.response = None
        self.parser = None
        self.headers_done = None
        self.resume()
        if whole and self.keep_alive and not self.closed:
            self.pool._release(self)
        else:
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


class Upstream:
    """Pooled connections to engines; create it and ``start`` it inside the event loop."""

    def __init__(self, *, connect_timeout: float, read_timeout: float, connections: int) -> None:
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.connections = connections
        self._idle: dict[tuple, list[_Connection]] = {}
        self._targets: dict[str, _Target] = {}
        self._slots: asyncio.Semaphore | None = None
        self._ssl: ssl.SSLContext | None = None
        self.loop: asyncio.AbstractEventLoop

    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self._slots = asyncio.Semaphore(self.connections)

    async def close(self) -> None:
        for connections in self._idle.values():
            for connection in connections:
                connection.abort()
        self._idle.clear()

    def _target(self, url: str) -> _Target:
        target = self._targets.get(url)
        if target is None:
            target = self._targets[url] = _Target(url)
        return target

    async def post(
        self, base_url: str, path: str, body: bytes, headers: list[tuple[bytes, bytes]],
        rest: Rest | None = None,
    ) -> Response:  # fmt: skip
        """POST ``body``, followed by ``rest`` when the body is an upload's head."""
        return await self.request(b"POST", base_url, path, body, headers, rest)

    async def get(self, base_url: str, path: str, headers: list[tuple[bytes, bytes]]) -> Response:
        return await self.request(b"GET", base_url, path, b"", headers)

    async def request(
        self, method: bytes, base_url: str, path: str, body: bytes,
        headers: list[tuple[bytes, bytes]], rest: Rest | None = None,
    ) -> Response:  # fmt: skip
        """Send and return once the status and headers are in; the body is still to read.

        Raises UpstreamUnreachable when no answer began, so the caller may try another
        replica. ``close()`` the response when done with it: that returns the connection
        to the pool, or hangs up on the engine if the answer was not read whole.
        """
        try:
            target = self._target(base_url)
        except ValueError as exc:
            raise UpstreamUnreachable("connect", str(exc)) from None
        encoded = b"".join(
            b"%s: %s\r\n" % (name, value)
            for name, value in headers
            if b"\r" not in value and b"\n" not in value
        )
        assert self._slots is not None, "Upstream.start() was not called"
        # An upload's rest can be sent once: never on a kept-alive connection that may have
        # been closed under it.
        for fresh in (True,) if rest is not None else (False, True):
            # A slot per request, held until its response is closed (see _Connection.finished).
            await self._slots.acquire()
            try:
                connection, reused = await self._connection(target, base_url, fresh=fresh)
            except BaseException:
                self._slots.release()
                raise
            try:
                return await connection.request(
                    method, target, (target.prefix + path).encode(), body, encoded, rest
                )
            except ConnectionError:
                if reused and not fresh:
                    # An engine may close a kept-alive connection just as it is reused
                    # (llama-server does right after a streamed answer): nothing was
                    # answered, so send it once more on a new connection.
                    continue
                kind = "disconnected"
                detail = f"{base_url} closed the connection before answering"
            except TimeoutError:
                kind, detail = "timeout", f"{base_url} did not answer in {self.read_timeout:g} s"
            except UpstreamBroken as exc:
                kind, detail = "error", f"{base_url}: {exc}"
            raise UpstreamUnreachable(kind, detail)
        raise AssertionError("unreachable")  # pragma: no cover

    async def _connection(
        self, target: _Target, url: str, *, fresh: bool = False
    ) -> tuple[_Connection, bool]:
        idle = self._idle.get(target.key)
        now = self.loop.time()
        while idle and not fresh:
            connection = idle.pop()
            usable = not connection.closed and not (
                connection.transport is not None and connection.transport.is_closing()
            )
            if usable and now - connection.idle_since < KEEPALIVE_SECONDS:
                return connection, True
            connection.abort()
        if target.ssl and self._ssl is None:
            self._ssl = ssl.create_default_context()
        try:
            async with asyncio.timeout(self.connect_timeout):
                _transport, connection = await self.loop.create_connection(
                    lambda: _Connection(self, target.key), target.host, target.port,
                    ssl=self._ssl if target.ssl else None,
                )  # fmt: skip
        except TimeoutError:
            raise UpstreamUnreachable(
                "connect", f"cannot connect to {url}: no answer in {self.connect_timeout:g} s"
            ) from None
        except OSError as exc:
            raise UpstreamUnreachable(
                "connect", f"cannot connect to {url}: {exc.strerror or exc}"
            ) from None
        return connection, False

    def _release(self, connection: _Connection) -> None:
        connection.idle_since = self.loop.time()
        self._idle.setdefault(connection.key, []).append(connection)
