"""Heartbeats are hot: keep the latest per node in memory, write them in batches.

One UPDATE per heartbeat costs the control plane ~2,000 nodes at 5 s; one batched
UPDATE every couple of seconds for all nodes heard from costs almost nothing.
"""

from __future__ import annotations

import asyncio
import json
import logging
from datetime import datetime

from channels.db import database_sync_to_async
from django.db import connection, transaction
from django.utils import timezone

from audit import notices
from audit.actors import AGENT_LINK
from fleet import history
from fleet.actions.liveness import revive_node
from fleet.actions.reports import record_qualifications_gained
from fleet.models import Node, NodeState, known_memory, ram_gained

log = logging.getLogger("llmgw.fleet.link.heartbeats")

FLUSH_INTERVAL = 2.0
# Rows a statement: the database thread holds the GIL for its Python work, and the event
# loop waits on it. In chunks, with a pause between, no heartbeat waits on a whole flush
# (bench/heartbeats.py at 3,000 agents).
FLUSH_CHUNK = 250
FLUSH_PAUSE = 0.005


class HeartbeatBatcher:
    """Collect the latest heartbeat per node; flush them with one statement."""

    def __init__(self) -> None:
        self._latest: dict[str, tuple[datetime, dict]] = {}
        self._task: asyncio.Task | None = None

    def record(self, node_id: str, usage: dict, at: datetime | None = None) -> None:
        self._latest[node_id] = (at or timezone.now(), usage)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._flush_soon())

    async def _flush_soon(self) -> None:
        await asyncio.sleep(FLUSH_INTERVAL)
        await self.flush()

    async def flush(self) -> int:
        batch, self._latest = self._latest, {}
        node_ids = list(batch)
        written = 0
        for start in range(0, len(node_ids), FLUSH_CHUNK):
            chunk = {node_id: batch[node_id] for node_id in node_ids[start : start + FLUSH_CHUNK]}
            if start:
                await asyncio.sleep(FLUSH_PAUSE)
            try:
                await database_sync_to_async(write_heartbeats)(chunk)
            except Exception:
                # Keep the rest for the next flush (newer ones win): dropping them would
                # make live nodes look silent to liveness.
                rest = {node_id: batch[node_id] for node_id in node_ids[start:]}
                log.exception(
                    "writing %d heartbeats failed; retrying with the next batch", len(rest)
                )
                self._latest = {**rest, **self._latest}
                break
            written += len(chunk)
        return written


def write_heartbeats(batch: dict[str, tuple[datetime, dict]]) -> None:
    """One UPDATE … FROM (VALUES …) for the whole batch; then revive silent nodes and say
    which grew (both rare, so per node)."""
    if not batch:
        return
    rows = [(node_id, at, json.dumps(usage)) for node_id, (at, usage) in batch.items()]
    placeholders = ", ".join(["(%s, %s::timestamptz, %s::jsonb)"] * len(rows))
    params = [value for row in rows for value in row]
    table = Node._meta.db_table
    with transaction.atomic(), connection.cursor() as cursor:
        # ``was`` is the row as it was before this UPDATE: the RAM known until now.
        cursor.execute(
            f"UPDATE {table} AS n SET last_heartbeat = v.at, usage = v.usage, "  # noqa: S608
            "usage_reported_at = v.at "
            f"FROM (VALUES {placeholders}) AS v(id, at, usage), {table} AS was "
            "WHERE n.id = v.id AND was.id = n.id "
            "RETURNING n.id, n.state, "
            "COALESCE((was.inventory->>'memory_total')::bigint, 0), "
            "COALESCE((was.usage->>'memory_total')::bigint, 0)",
            params,
        )
        written = cursor.fetchall()
        silent = [node_id for node_id, state, *_known in written if state != NodeState.CONNECTED]
        for node_id, _state, inventory_total, heartbeat_total in written:
            before = known_memory(inventory_total, heartbeat_total)
            now_total = batch[node_id][1].get("memory_total") or 0
            record_qualifications_gained(node_id, ram_gained(before, now_total), actor=AGENT_LINK)
    # One sample a node every few heartbeats for the node page's charts, then one
    # message for the whole batch so open pages redraw their bars.
    history.record_samples(batch)
    notices.usage_changed(batch.keys())
    # A heartbeat from an unreachable or lost node brings it back (rare; per node).
    for node_id in silent:
        revive_node(node_id, actor=AGENT_LINK)


batcher = HeartbeatBatcher()
