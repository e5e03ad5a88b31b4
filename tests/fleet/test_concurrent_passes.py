"""Two reconcilers at once against one database: one pass at a time, never a GPU twice."""

from __future__ import annotations

import threading
from collections import Counter

import pytest
from django.db import connections

from catalog.actions.entries import apply_catalog
from fleet.models import Replica, ReplicaState, Shard
from fleet.reconcile.passes import reconcile
from tests.factories import SETUP
from tests.fleet.cluster import catalog, connect

pytestmark = pytest.mark.django_db(transaction=True)

PASSES = 50


def test_fifty_concurrent_passes_hold_every_gpu_at_most_once(node_ids):
    for node_id in node_ids[:2]:
        connect(node_id, gpus=4)
    # More replicas wanted than there are GPUs: every pass wants to place something.
    apply_catalog(catalog(replicas=12, gpus=1), actor=SETUP)
    start = threading.Barrier(PASSES)
    reports, errors = [], []

    def one_pass() -> None:
        try:
            start.wait()
            reports.append(reconcile())
        except Exception as exc:  # noqa: BLE001 (reported below, with the pass's error)
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=one_pass) for _ in range(PASSES)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors
    assert len(reports) == PASSES
    assert any(report.skipped for report in reports)  # they really did overlap

    held = Counter(
        (shard.node_id, gpu)
        for shard in Shard.objects.filter(replica__state__in=ReplicaState.LIVE)
        for gpu in shard.gpus
    )
    assert held and max(held.values()) == 1, held
    assert len(held) == 8  # every GPU of the two nodes is in use
    assert Replica.objects.filter(state__in=ReplicaState.LIVE).count() == 12  # no duplicates
