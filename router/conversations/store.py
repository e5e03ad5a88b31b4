"""Where the router keeps Responses conversations: Redis with a TTL, and a copy in memory.

Redis, not PostgreSQL: every router already shares it (response ids, rate limits), a TTL
expires a conversation without a sweeper, and a write on an answer's path costs one
``SET`` rather than a database transaction. The copy in this router's memory is written
before the client gets the answer, so a follow-up that comes back here finds it at once
(the Redis write follows a moment later, for the other routers); in router-only mode,
with no Redis, memory is all there is.

Bounded in time (``LLMGW_ROUTER_CONVERSATION_SECONDS``, the Redis TTL and the memory
copy's expiry alike) and in size (``LLMGW_ROUTER_CONVERSATION_BYTES`` a conversation;
the memory copies together ``MEMORY_BYTES``, the least recently used dropped first).
A conversation over its bound is remembered only as being too long, so the follow-up is
told why rather than that the response is unknown.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from core.redis_clients import LaterRedis
from router.wire.compact_json import compact_json

logger = logging.getLogger(__name__)

KEY_PREFIX = "llmgw:conversation:"
# What one router holds in memory, all conversations together.
MEMORY_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class Kept:
    """One response the router made or relayed, and the conversation up to and with it."""

    response_id: str
    owner: str  # the key (or account) that made it (Caller.owner); only it may use it
    model: str
    items: list[dict[str, Any]] = field(default_factory=list)  # input items, in order
    response: dict[str, Any] = field(default_factory=dict)  # as the client got it
    too_long: bool = False  # over the bound: kept only to say so

    def encoded(self) -> bytes:
        return compact_json(asdict(self))

    @classmethod
    def decoded(cls, data: bytes) -> Kept | None:
        try:
            return cls(**json.loads(data))
        except (ValueError, TypeError):
            return None


class ConversationStore:
    """Kept conversations by response id: this router's memory, then the shared Redis."""

    def __init__(
        self, redis_url: Callable[[], str] = str, *, max_bytes: int = 2 * 1024 * 1024,
        seconds: float = 24 * 3600, clock: Callable[[], float] = time.monotonic,
    ) -> None:  # fmt: skip
        """``redis_url`` gives the Redis the routers share ("" while there is none)."""
        self.max_bytes = max_bytes
        self.seconds = seconds
        self.clock = clock
        self._memory: OrderedDict[str, tuple[float, bytes]] = OrderedDict()
        self._memory_bytes = 0
        self._redis = LaterRedis(redis_url)
        self._writing: set[asyncio.Task] = set()

    def keep(self, kept: Kept) -> None:
        """Hold ``kept`` here now and in Redis shortly (off the answer's path)."""
        data = kept.encoded()
        if len(data) > self.max_bytes:  # kept only to say so, and for GET while it fits
            marker = Kept(kept.response_id, kept.owner, kept.model, response=kept.response,
                          too_long=True)  # fmt: skip
            data = marker.encoded()
            if len(data) > self.max_bytes:
                data = Kept(kept.response_id, kept.owner, kept.model, too_long=True).encoded()
        self._hold(kept.response_id, data)
        client = self._shared()
        if client is not None:
            task = asyncio.ensure_future(self._write(client, kept.response_id, data))
            self._writing.add(task)
            task.add_done_callback(self._writing.discard)

    async def recall(self, response_id: str) -> Kept | None:
        """The conversation up to ``response_id``; None when no router keeps it (never
        made, expired, deleted, or Redis cannot be read)."""
        held = self._memory.get(response_id)
        if held is not None and held[0] > self.clock():
            self._memory.move_to_end(response_id)
            return Kept.decoded(held[1])
        client = self._shared()
        if client is None:
            return None
        try:
            data = await client.get(KEY_PREFIX + response_id)
        except Exception as exc:
            logger.warning("could not read the conversation of %s from Redis: %s",
                           response_id, exc)  # fmt: skip
            return None
        return None if data is None else Kept.decoded(data)

    async def forget(self, response_id: str) -> None:
        held = self._memory.pop(response_id, None)
        if held is not None:
            self._memory_bytes -= len(held[1])
        client = self._shared()
        if client is not None:
            try:
                await client.delete(KEY_PREFIX + response_id)
            except Exception as exc:
                logger.warning("could not delete the conversation of %s in Redis: %s",
                               response_id, exc)  # fmt: skip

    async def close(self) -> None:
        if self._writing:
            await asyncio.gather(*self._writing, return_exceptions=True)
        await self._redis.close()

    def _hold(self, response_id: str, data: bytes) -> None:
        old = self._memory.pop(response_id, None)
        if old is not None:
            self._memory_bytes -= len(old[1])
        self._memory[response_id] = (self.clock() + self.seconds, data)
        self._memory_bytes += len(data)
        while self._memory_bytes > MEMORY_BYTES and len(self._memory) > 1:
            _id, (_until, dropped) = self._memory.popitem(last=False)
            self._memory_bytes -= len(dropped)

    def _shared(self):
        return self._redis.client()

    async def _write(self, client, response_id: str, data: bytes) -> None:
        try:
            await client.set(KEY_PREFIX + response_id, data, ex=max(1, int(self.seconds)))
        except Exception as exc:
            logger.warning("could not keep the conversation of %s in Redis: %s",
                           response_id, exc)  # fmt: skip
