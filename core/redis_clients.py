"""One synchronous Redis client per process for the control plane's own small writes
(leader lease, routing notifications, node history), with short timeouts so a state
change or a heartbeat write never hangs because Redis is slow or away."""

from __future__ import annotations

import functools

import redis
from django.conf import settings

TIMEOUT = 2.0


def redis_client() -> redis.Redis:
    return _client_for(settings.REDIS_URL)


@functools.cache
def _client_for(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, socket_timeout=TIMEOUT, socket_connect_timeout=TIMEOUT)
