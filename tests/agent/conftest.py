from __future__ import annotations

import pytest
from stub_engine import Harness


@pytest.fixture
def harness(tmp_path):
    """Stand-in engines under a supervisor of their own; every one is stopped afterwards."""
    h = Harness(tmp_path)
    yield h
    h.cleanup()
