"""Closing a revoked node's live link, in whichever control-plane process holds it.

Agents' consumers use no channel layer (see ``consumer``), so each process keeps its own
live links by node id and one Redis subscription for them all, to ``REVOKED_CHANNEL``.
A notice names a node; the database says whether it is revoked (a notice anyone could
publish closes nothing by itself), and the links of a revoked node close with the reason.
Every ``REVOCATION_RECHECK`` seconds the process also looks at all its links at once (two
queries), so a notice lost while Redis was away costs that long, not the revocation.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from collections.abc import Iterable
from typing import Protocol

from channels.db import database_sync_to_async
from django.conf import settings

from core.redis_urls import parse_redis_url
from core.subscriptions import listen_forever
from fleet.pki.revocation import REVOKED_CHANNEL, revoked_links

log = logging.getLogger("llmgw.fleet.link")

# How long a link waits for this process's first subscription before it is answered: a
# revocation right after a process starts must not slip past a subscription half made.
SUBSCRIBE_WAIT = 2.0


class Link(Protocol):
    node_id: str | None
    generation: str

    async def close_revoked(self) -> None: ...


class LiveLinks:
    """This process's open links by node id, and the watch that closes revoked ones."""

    def __init__(self) -> None:
        self._links: dict[str, set[Link]] = defaultdict(set)
        self._watch: asyncio.Task | None = None
        self._subscribed = asyncio.Event()

    async def add(self, link: Link) -> None:
        assert link.node_id is not None
        await self._ensure_watching()
        self._links[link.node_id].add(link)

    def remove(self, link: Link) -> None:
        links = self._links.get(link.node_id or "")
        if links is not None:
            links.discard(link)
            if not links:
                del self._links[link.node_id or ""]

    async def close_revoked(self, node_ids: Iterable[str] | None = None) -> int:
        """Close the links of ``node_ids`` (all, when None) that are revoked; how many."""
        wanted = (
            list(self._links) if node_ids is None else [n for n in node_ids if n in self._links]
        )
        generations = {node: {link.generation for link in self._links[node]} for node in wanted}
        if not generations:
            return 0
        revoked = await database_sync_to_async(revoked_links)(generations)
        closing = [
            link
            for node, gone in revoked.items()
            for link in list(self._links.get(node, ()))
            if link.generation in gone
        ]
        for link in closing:
            self.remove(link)
            await link.close_revoked()
        return len(closing)

    async def _ensure_watching(self) -> None:
        loop = asyncio.get_running_loop()
        if self._watch is not None and not self._watch.done() and self._watch.get_loop() is loop:
            return
        # A new loop (a test's) starts afresh: links of a loop that ended are gone with it.
        self._links.clear()
        self._subscribed = asyncio.Event()
        self._watch = loop.create_task(self._run())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._subscribed.wait(), SUBSCRIBE_WAIT)

    async def _run(self) -> None:
        await asyncio.gather(self._listen(), self._recheck())

    async def _recheck(self) -> None:
        while True:
            await asyncio.sleep(settings.REVOCATION_RECHECK)
            try:
                await self.close_revoked()
            except Exception:
                log.exception("looking for revoked nodes among this process's links failed")

    async def _listen(self) -> None:
        url = parse_redis_url(settings.REDIS_URL, "REDIS_URL").client_url

        async def close_if_revoked(data: bytes) -> None:
            await self.close_revoked([data.decode(errors="replace")])

        await listen_forever(lambda: url, REVOKED_CHANNEL, close_if_revoked,
                             self._subscribed.set, log, "revocation notices")  # fmt: skip


live_links = LiveLinks()
