from __future__ import annotations

import uuid

import pytest

from tests.fleet.queues import broker


@pytest.fixture
def node_ids():
    """Unique node ids per test: queues live in the shared Redis."""
    ids = [f"n{uuid.uuid4().hex[:6]}-{i}" for i in range(3)]
    # The client is made now: a test may point settings.REDIS_URL at nothing, and the
    # settings fixture is restored only after this one is torn down.
    client = broker()
    yield ids
    client.delete(*(f"node-{node_id}" for node_id in ids))
