"""The control plane's Redis client, for the URL settings name now (a test that overrides
REDIS_URL gets a client for its own), on the lowest floor that reads settings."""

from __future__ import annotations

import redis
from django.conf import settings

from core.redis_clients import redis_client_for


def redis_client() -> redis.Redis:
    return redis_client_for(settings.REDIS_URL)
