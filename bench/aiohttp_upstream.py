"""The router's outbound interface (router/wire/upstream.py) on aiohttp's client, to
measure against.

Not used in production: bench/router_overhead.py serves ``bench.aiohttp_upstream:application``
(its ``+aiohttp`` variants), a router in static mode built with this client, next to
``router.asgi:application`` with the lean one.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp

from router.app import Router
from router.config import RouterConfig
from router.table.sources import StaticSource
from router.wire.connection import HOP_RESPONSE_HEADERS, Rest, UpstreamBroken
from router.wire.upstream import UpstreamUnreachable


class AiohttpResponse:
    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response
        self.status = response.status
        self.raw_headers = [(n.lower(), v) for n, v in response.raw_headers]

    @property
    def is_event_stream(self) -> bool:
        return self._response.content_type == "text/event-stream"

    def headers_for_client(self) -> list[tuple[bytes, bytes]]:
        return [(n, v) for n, v in self.raw_headers if n not in HOP_RESPONSE_HEADERS]

    async def chunks(self) -> AsyncIterator[bytes]:
        try:
            async for data in self._response.content.iter_any():
                yield data
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise UpstreamBroken(str(exc) or type(exc).__name__) from None

    async def read(self) -> bytes:
        try:
            return await self._response.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise UpstreamBroken(str(exc) or type(exc).__name__) from None

    def close(self) -> None:
        self._response.close()


class AiohttpUpstream:
    def __init__(self, *, connect_timeout: float, read_timeout: float, connections: int) -> None:
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.connections = connections
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(
                limit=self.connections, limit_per_host=0, keepalive_timeout=4
            ),
            timeout=aiohttp.ClientTimeout(
                total=None, sock_connect=self.connect_timeout, sock_read=self.read_timeout
            ),
            auto_decompress=False,
            skip_auto_headers=("Accept-Encoding",),
            cookie_jar=aiohttp.DummyCookieJar(),
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def post(
        self, base_url: str, path: str, body: bytes, headers: list[tuple[bytes, bytes]],
        rest: Rest | None = None,
    ) -> AiohttpResponse:  # fmt: skip
        """POST ``body``, followed by ``rest`` when the body is an upload's head."""
        return await self.request("POST", base_url, path, body, headers, rest)

    async def get(
        self, base_url: str, path: str, headers: list[tuple[bytes, bytes]]
    ) -> AiohttpResponse:
        return await self.request("GET", base_url, path, b"", headers)

    async def request(
        self, method: str, base_url: str, path: str, body: bytes,
        headers: list[tuple[bytes, bytes]], rest: Rest | None = None,
    ) -> AiohttpResponse:  # fmt: skip
        assert self._session is not None
        url = base_url + path
        try:
            response = await self._session.request(
                method,
                url,
                data=body if rest is None else _head_then_rest(body, rest),
                headers=[(n.decode("latin-1"), v.decode("latin-1")) for n, v in headers],
                allow_redirects=False,
            )
        except aiohttp.ClientConnectorError as exc:
            raise UpstreamUnreachable("connect", f"cannot connect to {url}: {exc}") from None
        except aiohttp.ServerDisconnectedError:
            raise UpstreamUnreachable("disconnected", f"{url} closed the connection") from None
        except TimeoutError:
            raise UpstreamUnreachable("timeout", f"{url} did not answer in time") from None
        except aiohttp.ClientError as exc:
            raise UpstreamUnreachable("error", f"{url}: {exc}") from None
        return AiohttpResponse(response)


async def _head_then_rest(head: bytes, rest: Rest) -> AsyncIterator[bytes]:
    yield head
    async for chunk in rest.chunks:
        yield chunk


def static_router() -> Router:
    """A router serving ``LLMGW_ROUTER_STATIC`` through this client instead of the lean one."""
    config = RouterConfig.from_env()
    upstream = AiohttpUpstream(
        connect_timeout=config.connect_timeout,
        read_timeout=config.read_timeout,
        connections=config.upstream_connections,
    )
    return Router(config, StaticSource(config.static_path), upstream)  # type: ignore[arg-type]


application = static_router()
