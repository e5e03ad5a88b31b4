"""Requests and tokens per key, model and hour: counted in memory, written in batches.

The request path only adds to a dictionary; a background task hands the totals to a
writer every few seconds (``LLMGW_ROUTER_ACCOUNTING_SECONDS``). A write that fails
keeps its totals for the next one, so a database outage delays accounting without
losing it (until the router itself stops).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

logger = logging.getLogger(__name__)


@dataclass
class PendingUsage:
    """What one key spent on one model in one hour, counted here and not yet added to
    its ``router.models.Usage`` row."""

    hour: int  # hours since the epoch
    key_prefix: str
    key_name: str
    model: str
    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_prompt_tokens: int = 0  # of prompt_tokens, read from the engine's prompt cache


UsageWriter = Callable[[list[PendingUsage]], None]
AsyncUsageWriter = Callable[[list[PendingUsage]], Awaitable[None]]


class Accounting:
    """Totals since the last write."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._pending: dict[tuple[int, str, str], PendingUsage] = {}

    def record(
        self, key_prefix: str, key_name: str, model: str, prompt: int, completion: int,
        *, cached_prompt: int = 0,
    ) -> None:  # fmt: skip
        """Count one request: ``prompt`` is the whole prompt, ``cached_prompt`` its part
        the engine read from its cache."""
        hour = int(self.clock()) // 3600
        slot = (hour, key_prefix, model)
        usage = self._pending.get(slot)
        if usage is None:
            usage = self._pending[slot] = PendingUsage(hour, key_prefix, key_name, model)
        usage.requests += 1
        usage.prompt_tokens += prompt
        usage.completion_tokens += completion
        usage.cached_prompt_tokens += cached_prompt

    def take(self) -> list[PendingUsage]:
        """Everything pending, leaving nothing; give it back with ``restore`` if unwritten."""
        pending, self._pending = self._pending, {}
        return list(pending.values())

    def restore(self, rows: list[PendingUsage]) -> None:
        for row in rows:
            slot = (row.hour, row.key_prefix, row.model)
            usage = self._pending.get(slot)
            if usage is None:
                self._pending[slot] = row
            else:
                usage.requests += row.requests
                usage.prompt_tokens += row.prompt_tokens
                usage.completion_tokens += row.completion_tokens
                usage.cached_prompt_tokens += row.cached_prompt_tokens

    async def flush(self, write: AsyncUsageWriter) -> None:
        """Hand everything pending to ``write``; what it fails to write is kept for the next."""
        rows = self.take()
        if not rows:
            return
        try:
            await write(rows)
        except Exception as exc:
            logger.warning("accounting not written, keeping it for the next try: %s", exc)
            self.restore(rows)

    async def flush_every(self, seconds: float, write: AsyncUsageWriter) -> None:
        """``flush`` every ``seconds`` until cancelled: never on a request's path."""
        while True:
            await asyncio.sleep(seconds)
            await self.flush(write)


UPSERT = """
INSERT INTO router_usage
    (hour, key_prefix, key_name, model, requests, prompt_tokens, completion_tokens,
     cached_prompt_tokens)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s)
ON CONFLICT (hour, key_prefix, model) DO UPDATE SET
    key_name = EXCLUDED.key_name,
    requests = router_usage.requests + EXCLUDED.requests,
    prompt_tokens = router_usage.prompt_tokens + EXCLUDED.prompt_tokens,
    completion_tokens = router_usage.completion_tokens + EXCLUDED.completion_tokens,
    cached_prompt_tokens = router_usage.cached_prompt_tokens + EXCLUDED.cached_prompt_tokens
"""


def write_usage(rows: list[PendingUsage]) -> None:
    """Add ``rows`` to router_usage in one statement batch (Django's connection, sync)."""
    from datetime import UTC, datetime

    from django.db import connection, transaction

    if not rows:
        return
    params = [
        (
            datetime.fromtimestamp(row.hour * 3600, tz=UTC),
            row.key_prefix,
            row.key_name,
            row.model,
            row.requests,
            row.prompt_tokens,
            row.completion_tokens,
            row.cached_prompt_tokens,
        )
        # One order for every router, so two writing the same rows cannot deadlock.
        for row in sorted(rows, key=lambda r: (r.hour, r.key_prefix, r.model))
    ]
    # Increments, not values: several routers add to the same rows. Django's
    # bulk_create(update_conflicts=True) can only overwrite, hence the SQL.
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.executemany(UPSERT, params)
