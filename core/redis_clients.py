"""One synchronous Redis client per URL and process, for the control plane's own small
writes (leader lease, routing notifications, node history), with short timeouts so a
state change or a heartbeat write never hangs because Redis is slow or away. The URL is
the caller's to give: core reads no settings (``audit.redis`` gives REDIS_URL's)."""

from __future__ import annotations

import functools
from collections.abc import Callable

import redis
import redis.asyncio

from core.redis_urls import parse_redis_url

TIMEOUT = 2.0


@functools.cache
def redis_client_for(url: str) -> redis.Redis:
    # The URL's TLS options in redis-py's spelling; a missing CA file is named here.
    client_url = parse_redis_url(url, "REDIS_URL").client_url
    return redis.Redis.from_url(client_url, socket_timeout=TIMEOUT, socket_connect_timeout=TIMEOUT)


class LaterRedis:
    """An asyncio client of a Redis whose URL is known only later (a router learns it once
    its database source has loaded), made on first use with the same short timeouts; None
    while the URL is ""."""

    def __init__(self, url: Callable[[], str]) -> None:
        self.url = url
        self._client: redis.asyncio.Redis | None = None

    def client(self) -> redis.asyncio.Redis | None:
        if self._client is None:
            url = self.url()
            if url:
                self._client = redis.asyncio.Redis.from_url(
                    parse_redis_url(url, "REDIS_URL").client_url,
                    socket_timeout=TIMEOUT, socket_connect_timeout=TIMEOUT,
                )  # fmt: skip
        return self._client

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None
