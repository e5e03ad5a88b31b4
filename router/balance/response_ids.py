"""Which replica made each Responses API answer, so a conversation goes back to it.

An engine that serves ``/v1/responses`` natively may keep what it answered, and a request
naming ``previous_response_id`` (or ``GET``/``DELETE /v1/responses/{id}``) means only on
the replica that made it, and only for the key that asked for it (``Caller.owner``: another
key's is as unknown as one never made). The router notes the id of every such answer it relays: in
memory, the most recent ``KEPT`` of them, and (with a database source) in Redis for a day,
so a follow-up that reaches another router finds it too. A request for an id no router
knows, or whose replica is gone, is refused with the reason rather than sent where it
cannot be found.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections import OrderedDict
from collections.abc import Callable
from typing import NamedTuple

logger = logging.getLogger(__name__)

KEPT = 100_000
SHARED_PREFIX = "llmgw:response:"
SHARED_SECONDS = 24 * 3600
_RESPONSE_ID = re.compile(rb'"id"\s*:\s*"(resp_[^"\\]{1,200})"')


class MadeBy(NamedTuple):
    replica: str
    model: str
    owner: str = ""  # the key (or account) that asked for it (Caller.owner); only it may use it

    def for_caller(self, owner: str) -> bool:
        """Whether the caller whose ``Caller.owner`` this is may use the response: only its
        maker (one noted before owners were, "", belongs to no one)."""
        return bool(self.owner) and self.owner == owner


class ResponseIds:
    """Response id -> the replica and model that made it, the most recent ``KEPT``."""

    def __init__(self, kept: int = KEPT, redis_url: Callable[[], str] = str) -> None:
        """``redis_url`` gives the Redis the routers share ("" while there is none)."""
        self.kept = kept
        self.redis_url = redis_url
        self._made_by: OrderedDict[str, MadeBy] = OrderedDict()
        self._client = None
        self._sharing: set[asyncio.Task] = set()

    def note(self, response_id: str, replica: str, model: str, owner: str) -> None:
        made_by = self._made_by[response_id] = MadeBy(replica, model, owner)
        self._made_by.move_to_end(response_id)
        while len(self._made_by) > self.kept:
            self._made_by.popitem(last=False)
        client = self._shared()
        if client is not None:  # off the answer's path: the client has its answer already
            task = asyncio.ensure_future(self._share(client, response_id, made_by))
            self._sharing.add(task)
            task.add_done_callback(self._sharing.discard)

    async def made_by(self, response_id: str) -> MadeBy | None:
        """Who made ``response_id``: this router's memory first, then the other routers'."""
        known = self._made_by.get(response_id)
        client = self._shared()
        if known is not None or client is None:
            return known
        try:
            value = await client.get(SHARED_PREFIX + response_id)
        except Exception as exc:
            logger.warning("could not ask Redis which replica made %s: %s", response_id, exc)
            return None
        if value is None:
            return None
        # "replica model owner": the owner last, since it may hold spaces (a key's name).
        replica, _, rest = value.decode().partition(" ")
        model, _, owner = rest.partition(" ")
        return MadeBy(replica, model, owner)

    async def forget(self, response_id: str) -> None:
        self._made_by.pop(response_id, None)
        client = self._shared()
        if client is not None:
            try:
                await client.delete(SHARED_PREFIX + response_id)
            except Exception as exc:
                logger.warning("could not forget %s in Redis: %s", response_id, exc)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def _shared(self):
        if self._client is None:
            url = self.redis_url()
            if url:
                import redis.asyncio as aioredis

                self._client = aioredis.Redis.from_url(
                    url, socket_timeout=2, socket_connect_timeout=2
                )
        return self._client

    async def _share(self, client, response_id: str, made_by: MadeBy) -> None:
        try:
            await client.set(SHARED_PREFIX + response_id,
                             f"{made_by.replica} {made_by.model} {made_by.owner}",
                             ex=SHARED_SECONDS)  # fmt: skip
        except Exception as exc:
            logger.warning("could not tell the other routers who made %s: %s", response_id, exc)

    def note_answer(self, data: bytes, replica: str, model: str, owner: str) -> None:
        """Note the id of a whole Responses answer (or of the first streamed event
        carrying one: ``response.created`` holds the response), made for ``owner``."""
        found = _RESPONSE_ID.search(data)
        if found is not None:
            self.note(found.group(1).decode(), replica, model, owner)


def previous_response_id(payload: dict) -> str | None:
    value = payload.get("previous_response_id")
    return value if isinstance(value, str) and value else None
