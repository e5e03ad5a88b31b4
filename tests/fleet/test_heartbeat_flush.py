"""The batched heartbeat writer: a flush goes in chunks, and what fails is kept."""

from __future__ import annotations

import pytest
from channels.db import database_sync_to_async
from django.utils import timezone

from fleet.link import heartbeats
from fleet.link.heartbeats import FLUSH_CHUNK, HeartbeatBatcher
from fleet.models import Node

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

NODES = 2 * FLUSH_CHUNK + 10  # three chunks


def usage(cpu: float) -> dict:
    return {"cpu_percent": cpu, "load": [0.1, 0.1, 0.1], "memory_total": 8 << 30,
            "memory_used": 1 << 30, "memory_available": 7 << 30}  # fmt: skip


@pytest.fixture
def node_ids():
    ids = [f"flush-{i:04d}" for i in range(NODES)]
    Node.objects.bulk_create([Node(id=node_id, state="connected") for node_id in ids])
    return ids


def batch_of(batcher: HeartbeatBatcher, node_ids: list[str], cpu: float) -> None:
    now = timezone.now()
    for node_id in node_ids:
        batcher._latest[node_id] = (now, usage(cpu))


async def test_a_flush_writes_every_node_in_chunks(node_ids, monkeypatch):
    chunks: list[int] = []
    write = heartbeats.write_heartbeats
    monkeypatch.setattr(heartbeats, "write_heartbeats", lambda b: chunks.append(len(b)) or write(b))
    batcher = HeartbeatBatcher()
    batch_of(batcher, node_ids, 33.0)
    assert await batcher.flush() == NODES
    assert chunks == [FLUSH_CHUNK, FLUSH_CHUNK, 10]
    written = await database_sync_to_async(
        lambda: Node.objects.filter(id__in=node_ids, usage__cpu_percent=33.0).count()
    )()
    assert written == NODES


async def test_a_chunk_that_fails_is_kept_with_the_rest_for_the_next_flush(node_ids, monkeypatch):
    calls = []
    write = heartbeats.write_heartbeats

    def failing_second(batch):
        calls.append(len(batch))
        if len(calls) == 2:
            raise RuntimeError("database went away")
        write(batch)

    monkeypatch.setattr(heartbeats, "write_heartbeats", failing_second)
    batcher = HeartbeatBatcher()
    batch_of(batcher, node_ids, 44.0)
    assert await batcher.flush() == FLUSH_CHUNK
    # The failed chunk and the one after it wait for the next flush, none lost.
    assert sorted(batcher._latest) == node_ids[FLUSH_CHUNK:]
    monkeypatch.setattr(heartbeats, "write_heartbeats", write)
    assert await batcher.flush() == NODES - FLUSH_CHUNK
    written = await database_sync_to_async(
        lambda: Node.objects.filter(id__in=node_ids, usage__cpu_percent=44.0).count()
    )()
    assert written == NODES
