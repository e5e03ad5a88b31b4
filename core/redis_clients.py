"""One synchronous Redis client per URL and process, for the control plane's own small
writes (leader lease, routing notifications, node history), with short timeouts so a
state change or a heartbeat write never hangs because Redis is slow or away. The URL is
the caller's to give: core reads no settings (``audit.redis`` gives REDIS_URL's)."""

from __future__ import annotations

import functools

import redis

from core.redis_urls import parse_redis_url

TIMEOUT = 2.0


@functools.cache
def redis_client_for(url: str) -> redis.Redis:
    # The URL's TLS options in redis-py's spelling; a missing CA file is named here.
    client_url = parse_redis_url(url, "REDIS_URL").client_url
    return redis.Redis.from_url(client_url, socket_timeout=TIMEOUT, socket_connect_timeout=TIMEOUT)
