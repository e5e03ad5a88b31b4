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

Here: the pool (targets parsed once, idle connections by address, a slot per request in
flight) and what a failure to get an answer is called; one connection and its answer are
connection.py.
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from collections.abc import Callable
from typing import TypeVar
from urllib.parse import urlsplit

from router.wire.connection import EngineConnection, Response, Rest, UpstreamBroken

R = TypeVar("R", bound=Response)

# Request headers that describe this hop, not the request; never forwarded.
HOP_REQUEST_HEADERS = frozenset(
    {
        b"authorization", b"host", b"content-length", b"connection", b"keep-alive",
        b"transfer-encoding", b"te", b"trailer", b"upgrade", b"proxy-authorization",
        b"proxy-connection", b"accept-encoding", b"expect",
    }
)  # fmt: skip
# Idle connections are dropped after this, under llama-server's 5 s keep-alive, so the
# engine never closes a connection just as a request goes out on it.
KEEPALIVE_SECONDS = 4.0


class UpstreamUnreachable(Exception):
    """No answer began: connect refused or timed out, or the engine hung up first."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(detail)
        self.kind = kind


class Slots:
    """The requests in flight the pool allows (a semaphore that can also be taken at once,
    from a callback, when one is free), handed out first come, first served."""

    def __init__(self, count: int) -> None:
        self.free = count
        self.waiters: deque[asyncio.Future] = deque()

    def take_now(self) -> bool:
        if self.free <= 0 or self.waiters:
            return False
        self.free -= 1
        return True

    async def take(self) -> None:
        if self.take_now():
            return
        waiter = asyncio.get_running_loop().create_future()
        self.waiters.append(waiter)
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self.give()  # handed a slot just as it was cancelled: the next may have it
            elif waiter in self.waiters:
                self.waiters.remove(waiter)
            raise

    def give(self) -> None:
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the slot passes to it, still taken
                return
        self.free += 1


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


class Upstream:
    """Pooled connections to engines; create it and ``start`` it inside the event loop."""

    def __init__(self, *, connect_timeout: float, read_timeout: float, connections: int) -> None:
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.connections = connections
        self._idle: dict[tuple, list[EngineConnection]] = {}
        self._targets: dict[str, _Target] = {}
        self._slots: Slots | None = None
        self._ssl: ssl.SSLContext | None = None
        self.loop: asyncio.AbstractEventLoop

    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self._slots = Slots(self.connections)

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
        encoded = encode_headers(headers)
        assert self._slots is not None, "Upstream.start() was not called"
        # An upload's rest can be sent once: never on a kept-alive connection that may have
        # been closed under it.
        for fresh in (True,) if rest is not None else (False, True):
            # A slot per request, held until its response is closed (see _give_back).
            await self._slots.take()
            try:
                connection, reused = await self._connection(target, base_url, fresh=fresh)
            except BaseException:
                self._slots.give()
                raise
            try:
                return await connection.request(
                    method, target.host_header, (target.prefix + path).encode(), body, encoded,
                    rest,
                )  # fmt: skip
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

    def send_now(
        self, base_url: str, path: str, body: bytes, headers: list[tuple[bytes, bytes]],
        answer: Callable[[EngineConnection], R],
    ) -> R | None:  # fmt: skip
        """POST on a kept-alive connection at once, from a callback: the Response
        ``answer`` makes is told of the answer as it comes (router/forward/express.py).
        None, sending nothing, when no slot or no idle connection to that engine is free."""
        assert self._slots is not None, "Upstream.start() was not called"
        target = self._targets.get(base_url)
        if target is None or not self._slots.take_now():
            return None
        connection = self._idle_connection(target)
        if connection is None:
            self._slots.give()
            return None
        response = answer(connection)
        connection.send(b"POST", target.host_header, (target.prefix + path).encode(), body,
                        encode_headers(headers), response)  # fmt: skip
        return response

    def _idle_connection(self, target: _Target) -> EngineConnection | None:
        """A kept-alive connection to ``target`` still fit to carry a request, if any."""
        idle = self._idle.get(target.key)
        now = self.loop.time()
        while idle:
            connection = idle.pop()
            usable = not connection.closed and not (
                connection.transport is not None and connection.transport.is_closing()
            )
            if usable and now - connection.idle_since < KEEPALIVE_SECONDS:
                return connection
            connection.abort()
        return None

    async def _connection(
        self, target: _Target, url: str, *, fresh: bool = False
    ) -> tuple[EngineConnection, bool]:
        connection = None if fresh else self._idle_connection(target)
        if connection is not None:
            return connection, True
        if target.ssl and self._ssl is None:
            self._ssl = ssl.create_default_context()
        try:
            async with asyncio.timeout(self.connect_timeout):
                _transport, connection = await self.loop.create_connection(
                    lambda: EngineConnection(target.key, self.loop, self.read_timeout,
                                             self._give_back),
                    target.host, target.port,
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

    def _give_back(self, connection: EngineConnection, reusable: bool) -> None:
        """A request's answer was closed: free its slot, and keep its connection for the
        next request to that engine if the answer was read whole on a kept-alive one."""
        assert self._slots is not None
        self._slots.give()
        if reusable:
            connection.idle_since = self.loop.time()
            self._idle.setdefault(connection.key, []).append(connection)


def encode_headers(headers: list[tuple[bytes, bytes]]) -> bytes:
    """Headers as they go on the wire; one with a line break in its name or value is left
    out (it would let whoever chose it write headers of their own)."""
    text = b"".join([b"%s: %s\r\n" % header for header in headers])
    if text.count(b"\n") == len(headers) and text.count(b"\r") == len(headers):
        return text  # a line break a header, each its own end: the usual case, checked once
    return b"".join(
        b"%s: %s\r\n" % (name, value)
        for name, value in headers
        if not any(b in part for b in (b"\r", b"\n") for part in (name, value))
    )
