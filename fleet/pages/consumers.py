"""The pages' websockets: one per open page, pushing its fragments when the fleet changes.

A socket authenticates (signed-in users only, from the page's own origin), joins the
pages group and forwards: each change message names what changed, and the socket sends
the fragments of its page that the change touches, rendered for its user. Pushes are
coalesced (at most one every PUSH_INTERVAL s), so a burst of changes costs one render.
On connect the whole page is pushed, so a socket that reconnects re-syncs the page.
A page that shows a window of a long list (the cluster page's nodes) is pushed only
when a change touches a row it shows or moves what its window holds; a heartbeat pushes
its node's row alone.
"""

from __future__ import annotations

import asyncio
import logging
from urllib.parse import urlsplit

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer

from audit import notices
from catalog.permissions import is_operator
from fleet.pages import fragments
from fleet.pages.audit_page import audit_key

log = logging.getLogger("llmgw.fleet.pages")

PUSH_INTERVAL = 1.0
# Charts change with each history sample, every few heartbeats; no need to push them faster.
SLOW_PUSH_INTERVAL = 10.0


def same_origin(scope) -> bool:
    """A browser's socket must come from a page of this site (cross-site hijacking).

    Clients that send no Origin (not browsers) are judged by the session alone.
    """
    headers = dict(scope.get("headers", []))
    origin = headers.get(b"origin", b"").decode(errors="replace")
    if not origin:
        return True
    host = headers.get(b"host", b"").decode(errors="replace")
    return urlsplit(origin).netloc == host


class PageConsumer(AsyncWebsocketConsumer):
    page = ""

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated or not same_origin(self.scope):
            # Closing before accepting refuses the handshake (HTTP 403).
            await self.close()
            return
        self.key = self.page_key()
        self.can_operate = await database_sync_to_async(is_operator)(user)
        self.pending: set[str] = set()
        self.pending_rows: set[str] = set()  # the subjects of the rows ROWS asks for
        # The subjects of the rows this page shows, and what decided them (see Push).
        self.shown: frozenset[str] = frozenset()
        self.outline = None
        self.flusher: asyncio.Task | None = None
        self.last_push = 0.0
        self.last_slow_push = 0.0
        await self.channel_layer.group_add(notices.PAGES_GROUP, self.channel_name)
        await self.accept()
        self._schedule(set(fragments.PAGES[self.page].fragments), at_once=True)

    async def disconnect(self, code) -> None:
        flusher = getattr(self, "flusher", None)
        if flusher is not None:
            flusher.cancel()
        if hasattr(self, "key"):
            await self.channel_layer.group_discard(notices.PAGES_GROUP, self.channel_name)

    def page_key(self) -> str:
        kwargs = self.scope["url_route"]["kwargs"]
        return str(kwargs.get("node_id") or kwargs.get("name") or "")

    async def receive(self, text_data=None, bytes_data=None) -> None:
        """Pages only listen; anything a browser sends is ignored."""

    async def fleet_changed(self, event) -> None:
        subjects = event.get("subjects", [])
        names = fragments.touched(self.page, self.key, event["kind"], subjects, self.shown)
        if fragments.ROWS in names:
            self.pending_rows |= self.shown.intersection(subjects)
        loop = asyncio.get_running_loop()
        for slow in fragments.PAGES[self.page].slow:
            if slow in names and loop.time() - self.last_slow_push < SLOW_PUSH_INTERVAL:
                names.discard(slow)
        if names:
            self._schedule(names)

    def _schedule(self, names: set[str], at_once: bool = False) -> None:
        self.pending |= names
        if self.flusher is None or self.flusher.done():
            self.flusher = asyncio.get_running_loop().create_task(self._flush(at_once))

    async def _flush(self, at_once: bool) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self.pending:
                if not at_once:
                    await asyncio.sleep(max(0.0, self.last_push + PUSH_INTERVAL - loop.time()))
                at_once = False
                names, self.pending = self.pending, set()
                rows, self.pending_rows = self.pending_rows, set()
                push = await database_sync_to_async(fragments.render_push)(
                    self.page, self.key, self.can_operate, names, self.outline, rows
                )
                # Even a look that found nothing to push counts: a storm of changes
                # elsewhere costs this socket one look a PUSH_INTERVAL.
                self.last_push = loop.time()
                if push is None:
                    continue
                if push.shown is not None:
                    self.shown, self.outline = push.shown, push.outline
                await self.send(text_data=push.html)
                if names & set(fragments.PAGES[self.page].slow):
                    self.last_slow_push = self.last_push
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("could not push %s page %s", self.page, self.key)


class ClusterPageConsumer(PageConsumer):
    page = "cluster"

    def page_key(self) -> str:
        """The page's filter and page number, as its URL's query string says them."""
        return self.scope.get("query_string", b"").decode(errors="replace")


class AuditPageConsumer(PageConsumer):
    page = "audit"

    def page_key(self) -> str:
        """The reader and the page's filter: each socket shows what its own user may read."""
        return audit_key(self.scope["user"], self.scope.get("query_string", b"").decode())


class NodePageConsumer(PageConsumer):
    page = "node"


class LogsPageConsumer(PageConsumer):
    page = "logs"


class ModelPageConsumer(PageConsumer):
    page = "model"


class MirrorPageConsumer(PageConsumer):
    page = "mirror"
