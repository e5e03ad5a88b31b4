"""The control plane's process collects garbage rarely, with start-up's objects frozen."""

from __future__ import annotations

import gc

import pytest


@pytest.mark.django_db
def test_the_control_plane_collects_rarely_and_freezes_what_start_up_made():
    from llmgw_site import asgi

    assert gc.get_threshold() == asgi.COLLECT_AFTER
    assert asgi.COLLECT_AFTER[0] > 700 * 10  # far above CPython's default
    assert gc.get_freeze_count() > 0
