"""Reads that pages, the API and llmgw_ctl share."""

from __future__ import annotations

from typing import Any

from django.db.models import Prefetch
from django.utils import timezone

from catalog.models import Model
from fleet.models import Node, Replica, ReplicaState, Shard

LIVE_REPLICA_STATES = (
    ReplicaState.PLACING,
    ReplicaState.UNPLACEABLE,
    ReplicaState.STARTING,
    ReplicaState.READY,
    ReplicaState.FAILED,
    ReplicaState.STOPPING,
)


def live_replicas():
    """Replicas that are not yet stopped, with their shards, ordered for display."""
    return Replica.objects.filter(state__in=LIVE_REPLICA_STATES).prefetch_related(
        Prefetch("shards", queryset=Shard.objects.select_related("node").order_by("rank"))
    )


def model_rows() -> list[dict[str, Any]]:
    """For each catalog model: wanted and ready replicas, and the live replicas themselves."""
    replicas_by_model: dict[str, list[Replica]] = {}
    for replica in live_replicas():
        replicas_by_model.setdefault(replica.model_name, []).append(replica)
    rows = []
    for model in Model.objects.prefetch_related("profiles"):
        replicas = replicas_by_model.pop(model.name, [])
        fingerprints = {p.name: p.fingerprint() for p in model.profiles.all()}
        rows.append(
            {
                "name": model.name,
                "aliases": model.aliases,
                "wanted": sum(p.replicas for p in model.profiles.all()),
                "ready": sum(1 for r in replicas if r.state == ReplicaState.READY),
                "replicas": [
                    {
                        "replica": r,
                        "stale": r.fingerprint != fingerprints.get(r.profile_name),
                    }
                    for r in replicas
                ],
            }
        )
    # Replicas whose model left the catalog still show until they are stopped.
    for name, replicas in sorted(replicas_by_model.items()):
        rows.append(
            {
                "name": name,
                "aliases": [],
                "wanted": 0,
                "ready": sum(1 for r in replicas if r.state == ReplicaState.READY),
                "replicas": [{"replica": r, "stale": True} for r in replicas],
            }
        )
    return rows


def cluster_overview() -> dict[str, Any]:
    now = timezone.now()
    nodes = [{"node": node, "silence": node.silence(now)} for node in Node.objects.all()]
    return {"nodes": nodes, "models": model_rows(), "now": now}
