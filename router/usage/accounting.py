"""Requests and tokens per key, model and hour: counted in memory, written in batches.

The request path only adds to a dictionary; a background task hands the totals to a
writer every second (``LLMGW_ROUTER_ACCOUNTING_SECONDS``), and the router writes what is
left when it stops (SIGTERM). A write that fails keeps its totals for the next one, so a
database outage delays accounting without losing it (until the router itself stops).

These rows are the ledger of record for day and month budgets (issue 41):
``ledger_totals`` reads a key's day and month from them, and ``Accounting.unwritten``
adds what this router counted and has not written yet. Redis's counters are a cache of
them (router/intake/limits.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from router.usage.journal import Journal

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
    """Totals since the last write, journalled (journal.py) where a journal is kept."""

    def __init__(
        self, clock: Callable[[], float] = time.time, journal: Journal | None = None
    ) -> None:
        self.clock = clock
        self.journal = journal
        # Told the keys of the journals adopted once they are in the rows (router/app.py:
        # the limiter raises their totals to the ledger).
        self.adopted: Callable[[set[str]], Awaitable[None]] | None = None
        self._pending: dict[tuple[int, str, str], PendingUsage] = {}
        self._writing: list[PendingUsage] = []  # taken by a write not finished yet
        self._requests = 0
        self._written_files: list[Path] = []  # journals to remove once a write succeeds

    def begin(self, key_prefix: str, key_name: str, model: str, prompt: int) -> int:
        """A request reached an engine: journalled with its prompt's estimate, which a
        router killed before it was counted leaves charged. Returns its number, for
        ``record``."""
        self._requests += 1
        if self.journal is not None:
            self.journal.begun(self._requests, int(self.clock()) // 3600, key_prefix, key_name,
                               model, prompt)  # fmt: skip
        return self._requests

    def record(
        self, key_prefix: str, key_name: str, model: str, prompt: int, completion: int,
        request: int | None = None, *, cached_prompt: int = 0,
    ) -> None:  # fmt: skip
        """Count one request: ``prompt`` is the whole prompt, ``cached_prompt`` its part
        the engine read from its cache; ``request`` is ``begin``'s number, if it began."""
        hour = int(self.clock()) // 3600
        if self.journal is not None:
            if request is None:
                self._requests += 1
                request = self._requests
            self.journal.counted(request, hour, key_prefix, key_name, model, prompt,
                                 completion, cached_prompt)  # fmt: skip
        slot = (hour, key_prefix, model)
        usage = self._pending.get(slot)
        if usage is None:
            usage = self._pending[slot] = PendingUsage(hour, key_prefix, key_name, model)
        usage.requests += 1
        usage.prompt_tokens += prompt
        usage.completion_tokens += completion
        usage.cached_prompt_tokens += cached_prompt

    def unwritten(self, key_prefix: str, day_start: float, month_start: float) -> tuple[int, int]:
        """The tokens of ``key_prefix`` this router counted since ``day_start`` and since
        ``month_start`` that no write has reached the database with yet."""
        day = month = 0
        for row in [*self._pending.values(), *self._writing]:
            if row.key_prefix != key_prefix or row.hour * 3600 < month_start:
                continue
            tokens = row.prompt_tokens + row.completion_tokens
            month += tokens
            if row.hour * 3600 >= day_start:
                day += tokens
        return day, month

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
        adopted: set[str] = set()
        if self.journal is not None:
            adopted = self.adopt()
            if self._pending:
                self._written_files.append(self.journal.rotate())
        rows = self.take()
        if not rows:
            return
        self._writing = rows
        try:
            await write(rows)
        except Exception as exc:
            logger.warning("accounting not written, keeping it for the next try: %s", exc)
            self.restore(rows)
            return
        finally:
            self._writing = []  # in the rows now, or pending again: never counted twice
        files, self._written_files = self._written_files, []
        for path in files:
            path.unlink(missing_ok=True)
        if adopted and self.adopted is not None:
            try:
                await self.adopted(adopted)
            except Exception as exc:  # noqa: BLE001  # the next miss rebuilds them
                logger.warning("adopted usage not raised in Redis: %s", exc)

    def close(self) -> None:
        """At the router's end: its journal goes once everything it holds is written."""
        if self.journal is not None and not self._pending:
            for path in self._written_files:
                path.unlink(missing_ok=True)
            self.journal.close()

    def adopt(self) -> set[str]:
        """Take in the journals of routers that are gone (written with the next write);
        return the keys they served."""
        assert self.journal is not None
        entries, files = self.journal.adopt()
        self.restore([
            PendingUsage(e["h"], e["p"], e["n"], e["m"], 1, e["pt"], e["ct"], e.get("cp", 0))
            for e in entries
        ])  # fmt: skip
        self._written_files += files
        return {e["p"] for e in entries if e["p"]}

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


LEDGER = """
SELECT COALESCE(SUM(prompt_tokens + completion_tokens) FILTER (WHERE hour >= %s), 0),
       COALESCE(SUM(prompt_tokens + completion_tokens), 0)
FROM router_usage WHERE key_prefix = %s AND hour >= %s
"""


# A team's: every key it ever held, revoked ones too (their spending today still counts).
TEAM_LEDGER = """
SELECT COALESCE(SUM(prompt_tokens + completion_tokens) FILTER (WHERE hour >= %s), 0),
       COALESCE(SUM(prompt_tokens + completion_tokens), 0)
FROM router_usage WHERE key_prefix IN (
    SELECT k.prefix FROM catalog_apikey k JOIN catalog_team t ON t.id = k.team_id
    WHERE t.name = %s
) AND hour >= %s
"""


def ledger_totals(key_prefix: str, day_start: float, month_start: float) -> tuple[int, int]:
    """A key's tokens since ``day_start`` and since ``month_start`` (hour boundaries), as
    the usage rows of every router hold them (Django's connection, sync); a team's (its
    counter name, ``protocol.rate_limits.team_counter_name``) are all its keys'."""
    from datetime import UTC, datetime

    from django.db import connection

    from protocol.rate_limits import counted_team

    team = counted_team(key_prefix)

    day = datetime.fromtimestamp(day_start, tz=UTC)
    month = datetime.fromtimestamp(month_start, tz=UTC)
    with connection.cursor() as cursor:
        cursor.execute(TEAM_LEDGER if team else LEDGER, (day, team or key_prefix, month))
        found = cursor.fetchone()
    return int(found[0]), int(found[1])
