from __future__ import annotations

import uuid

import pytest

from tests.fleet.queues import clear_queue


@pytest.fixture
def node_ids():
    """Unique node ids per test: queues live in the shared Redis."""
    ids = [f"n{uuid.uuid4().hex[:6]}-{i}" for i in range(3)]
    yield ids
    for node_id in ids:
        clear_queue(node_id)
