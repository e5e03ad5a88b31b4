"""The agent's outbound HTTP: timeouts, retries and the user agent in one place."""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import httpx

from protocol.sources import is_loopback_url

log = logging.getLogger("llmgw.agent.weights")

USER_AGENT = "llmgw-agent"
# A mirror that cannot take a connection in 10 s is down, not slow.
CONNECT_TIMEOUT = 10.0
# A server silent for a minute mid-file is stuck; the fetch resumes where it stopped.
READ_TIMEOUT = 60.0
# Five tries ride out a restarting proxy or a CDN hiccup without hiding a dead URL for long.
ATTEMPTS = 5
BACKOFF = 1.0
MAX_BACKOFF = 30.0
# Busy or restarting: worth asking again. Anything else 4xx/5xx is an answer.
_RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})


class OutboundError(Exception):
    """A request that got no usable answer after its retries."""


def retry_delay(attempt: int, backoff: float) -> float:
    """Return the pause before try ``attempt`` + 1: doubling, capped, with jitter so a
    fleet of agents that lost the same mirror does not come back in step."""
    base = min(MAX_BACKOFF, backoff * 2 ** max(attempt - 1, 0))
    return base * (0.5 + random.random() / 2)  # noqa: S311 - jitter, not a secret


def wait_before_retry(attempt: int, backoff: float, cancel: threading.Event | None) -> bool:
    """Pause before the next try; False if ``cancel`` was set meanwhile."""
    delay = retry_delay(attempt, backoff)
    if cancel is None:
        time.sleep(delay)
        return True
    return not cancel.wait(delay)


@contextmanager
def stream_get(
    url: str,
    headers: Mapping[str, str] | None = None,
    *,
    attempts: int = ATTEMPTS,
    backoff: float = BACKOFF,
    cancel: threading.Event | None = None,
) -> Iterator[httpx.Response]:
    """GET ``url`` and yield the response with its body unread, retrying connection
    errors and busy answers; any other status is the caller's to read."""
    # A proxy from the environment is meant for the internet, never for this machine.
    client = httpx.Client(
        timeout=httpx.Timeout(READ_TIMEOUT, connect=CONNECT_TIMEOUT),
        follow_redirects=True,
        trust_env=not is_loopback_url(url),
        headers={"User-Agent": USER_AGENT},
    )
    try:
        response = _send(client, url, dict(headers or {}), attempts, backoff, cancel)
        try:
            yield response
        finally:
            response.close()
    finally:
        client.close()


def _send(
    client: httpx.Client,
    url: str,
    headers: dict[str, str],
    attempts: int,
    backoff: float,
    cancel: threading.Event | None,
) -> httpx.Response:
    problem = ""
    for attempt in range(1, max(attempts, 1) + 1):
        if attempt > 1 and not wait_before_retry(attempt - 1, backoff, cancel):
            raise OutboundError(f"GET {url} cancelled while waiting to retry ({problem})")
        try:
            response = client.send(client.build_request("GET", url, headers=headers), stream=True)
        except httpx.TransportError as exc:
            problem = f"{type(exc).__name__}: {exc}"
            log.warning("GET %s failed (try %d of %d): %s", url, attempt, attempts, problem)
            continue
        except (
            httpx.HTTPError
        ) as exc:  # too many redirects, an invalid URL: asking again won't help
            raise OutboundError(f"GET {url} failed: {type(exc).__name__}: {exc}") from exc
        if url.startswith("https:") and response.url.scheme != "https":
            response.close()
            raise OutboundError(f"GET {url} was redirected to plain http ({response.url}); refused")
        if response.status_code in _RETRY_STATUSES:
            problem = f"answered {response.status_code} {response.reason_phrase}"
            response.close()
            log.warning("GET %s %s (try %d of %d)", url, problem, attempt, attempts)
            continue
        return response
    raise OutboundError(f"GET {url} failed {attempts} times; last: {problem}")
