"""The database and Redis as settings describe them, for the control plane's settings and the
router's alike: read from the environment, each problem named where the process starts."""

from __future__ import annotations

from typing import Any

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from core.env import env_str
from core.redis_urls import RedisURL, RedisURLError, parse_redis_url


def required_url(name: str, what: str) -> str:
    """A service URL from the environment. Settings start nothing: the entry points
    (`llmgw`, manage.py, the test runner, `celery -A llmgw_cli`) put the embedded
    servers' URLs here when none is configured."""
    url = env_str(name)
    if not url:
        raise ImproperlyConfigured(
            f"{name} is not set. Start llmgw through `llmgw`, `manage.py` or "
            f"`celery -A llmgw_cli`, which start an embedded {what} when none is configured, "
            f"or set {name} to your {what}'s URL."
        )
    return url


def database(url: str) -> dict[str, Any]:
    """Django's DATABASES entry for ``url``."""
    # Persistent connections: closing one per request fell to ~150 msg/s on the link.
    entry: dict[str, Any] = dict(
        dj_database_url.parse(url, conn_max_age=600, conn_health_checks=True)
    )
    # A unix-socket URL (?host=/dir) arrives as an option; HOST is where Django looks.
    if entry.get("OPTIONS", {}).get("host"):
        entry["HOST"] = entry["OPTIONS"].pop("host")
    return entry


def logging_config() -> dict[str, Any]:
    """Every process logs plainly to its standard error, at LOG_LEVEL."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
        "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
        "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
        # pgserver narrates every handle it opens and closes.
        "loggers": {"pgserver": {"level": "WARNING"}},
    }


def read_redis_url(url: str) -> RedisURL:
    """REDIS_URL read once, its password and TLS options (``rediss://…?ssl_ca_certs=``)
    handed to each library; a TLS file that is missing stops every process here."""
    try:
        return parse_redis_url(url, "REDIS_URL")
    except RedisURLError as exc:
        raise ImproperlyConfigured(str(exc)) from None
