"""Serving a saved table: which of the engines it names still answer.

A table read from disk may name engines that died while the database was away, and
nothing else tells the router so until requests fail on them. Every few seconds each
endpoint's ``GET /health`` is asked (with the engine's secret, under a short timeout),
and the table in use becomes the saved one without the endpoints that did not answer;
one that answers again is back in the next round.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from router.table.routes import Endpoint, RoutingTable
from router.wire.connection import UpstreamBroken
from router.wire.upstream import Upstream, UpstreamUnreachable

logger = logging.getLogger(__name__)


async def unanswering(upstream: Upstream, table: RoutingTable, wait: float) -> dict[str, str]:
    """Every endpoint of ``table`` whose engine does not answer its health check within
    ``wait`` seconds, with why."""
    endpoints = {e.replica: e for route in table.routes.values() for e in route.endpoints}
    answers = await asyncio.gather(*(_check(upstream, e, wait) for e in endpoints.values()))
    return {replica: why for replica, why in zip(endpoints, answers, strict=True) if why}


async def _check(upstream: Upstream, endpoint: Endpoint, wait: float) -> str | None:
    headers = [(b"authorization", endpoint.authorization)] if endpoint.authorization else []
    try:
        async with asyncio.timeout(wait):
            response = await upstream.get(endpoint.url, "/health", headers)
            try:
                await response.read()
            finally:
                response.close()
    except TimeoutError:
        return f"no answer in {wait:g} s"
    except (UpstreamUnreachable, UpstreamBroken) as exc:
        return str(exc)
    except Exception as exc:  # whatever it was, this engine cannot be vouched for
        return f"{type(exc).__name__}: {exc}"
    if not 200 <= response.status < 300:
        return f"it answered HTTP {response.status}"  # llama-server: 503 while loading
    return None


class SavedTableProbe:
    """Keeps the table in use to the saved table's endpoints whose engines answer."""

    def __init__(
        self, upstream: Upstream, use: Callable[[RoutingTable], None], interval: float,
        timeout: float,
    ) -> None:  # fmt: skip
        self.upstream = upstream
        self.use = use
        self.interval = interval
        self.timeout = timeout
        self._reported: dict[str, str] | None = None

    async def check(self, saved: RoutingTable) -> RoutingTable:
        """One round: ``saved`` without the endpoints that did not answer."""
        unanswered = await unanswering(self.upstream, saved, self.timeout)
        if self._reported is None or unanswered.keys() != self._reported.keys():
            total = sum(len(route.endpoints) for route in saved.routes.values())
            logger.warning(
                "serving the saved routing table: %d of %d engines answer their health "
                "check%s", total - len(unanswered), total,
                "".join(f"; {replica[:8]}: {why}" for replica, why in unanswered.items()),
            )  # fmt: skip
        self._reported = unanswered
        return saved.leaving_out(unanswered)

    async def run(self, saved: RoutingTable) -> None:
        """A round every ``interval`` until cancelled (the database's table replaced it)."""
        while True:
            await asyncio.sleep(self.interval)
            self.use(await self.check(saved))
