from __future__ import annotations

import os

import pytest
from stub_engine import Harness


@pytest.fixture
def harness(tmp_path):
    """Stand-in engines under a supervisor of their own; every one is stopped afterwards."""
    h = Harness(tmp_path)
    yield h
    h.cleanup()


@pytest.fixture
def pip_without_this_machines_config(monkeypatch):
    """Only a test's own wheels: this machine's pip.conf and PIP_* name mirrors and
    constraints (the modules that install from wheels made in the test use it)."""
    for name in [name for name in os.environ if name.startswith("PIP_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
