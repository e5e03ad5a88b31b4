"""Which replica made a response, shared by the routers through Redis."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from django.conf import settings

from router.balance.response_ids import MadeBy, ResponseIds

pytestmark = pytest.mark.asyncio

# Its owner (the key that asked) holds spaces, as a key's name may.
MADE = MadeBy("replica-a", "gemma", "llmgw-abc:playground: ann")


@pytest.fixture
def response_id():
    return f"resp_{uuid.uuid4().hex}"


async def test_a_response_noted_by_one_router_is_found_by_another(response_id):
    first, second = (ResponseIds(redis_url=lambda: settings.REDIS_URL) for _ in range(2))
    try:
        first.note(response_id, "replica-a", "gemma", "llmgw-abc:playground: ann")
        await asyncio_idle(first)
        assert await second.made_by(response_id) == MADE
        await second.forget(response_id)
        assert await first.made_by(response_id) == MADE  # its memory
        assert await ResponseIds(redis_url=lambda: settings.REDIS_URL).made_by(response_id) is None
    finally:
        await first.close()
        await second.close()


async def test_without_redis_a_router_knows_only_its_own(response_id):
    alone = ResponseIds()
    alone.note(response_id, "replica-a", "gemma", "llmgw-abc:playground: ann")
    assert await alone.made_by(response_id) == MADE
    assert await ResponseIds().made_by(response_id) is None


async def test_memory_keeps_the_most_recent(response_id):
    small = ResponseIds(kept=2)
    for n in range(3):
        small.note(f"{response_id}-{n}", "r", "m", "o")
    assert await small.made_by(f"{response_id}-0") is None
    assert await small.made_by(f"{response_id}-2") == MadeBy("r", "m", "o")


async def test_a_response_is_only_for_its_owner():
    assert MADE.for_caller("llmgw-abc:playground: ann")
    assert not MADE.for_caller("llmgw-xyz:other")
    assert not MadeBy("r", "m").for_caller("")  # noted before owners were: no one's


async def asyncio_idle(ids: ResponseIds) -> None:
    """Wait for the writes to Redis a note started."""
    await asyncio.gather(*ids._sharing)
