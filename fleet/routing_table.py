"""What the router needs from the database, and the channel that says it changed.

Routers keep the routing table and the API keys in memory and reload both when a
message arrives on ``ROUTING_CHANNEL`` (a replica became ready or went away, a key was
created or revoked), with a periodic full reload as the safety net for a lost message.
The other way, each router writes what it routes and carries under ``INFLIGHT_KEY_PREFIX``
(``router/inflight.py``), so a rolling restart knows when a drained replica is idle.
Importing this module needs no configured Django: the router imports the channel name
in its static mode too, and models are imported inside the functions that read them.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from core.redis_clients import redis_client

logger = logging.getLogger(__name__)

ROUTING_CHANNEL = "llmgw:routing"
# One key per router process: JSON {"at": unix time, "routed": [replica ids in its table],
# "inflight": {replica id: requests in flight}}; it expires when the router stops writing.
INFLIGHT_KEY_PREFIX = "llmgw:inflight:"
INFLIGHT_REPORT_SECONDS = 1.0
INFLIGHT_REPORT_TTL = 5


def publish_routing_change(kind: str = "replicas") -> None:
    """Tell every router to reload now; never raises, since the change is committed anyway.

    Call it through ``transaction.on_commit`` so a router that reloads at once sees the
    change. A lost message costs at most one periodic refresh (10 s by default).
    """
    try:
        redis_client().publish(ROUTING_CHANNEL, kind)
    except Exception as exc:
        logger.warning("could not tell routers about a %s change: %s", kind, exc)


def read_inflight_reports() -> list[dict[str, Any]] | None:
    """Every live router's latest report; None when Redis cannot be read (nothing is known)."""
    try:
        client = redis_client()
        keys = list(client.scan_iter(match=INFLIGHT_KEY_PREFIX + "*", count=100))
        values = client.mget(keys) if keys else []
    except Exception as exc:
        logger.warning("could not read the routers' in-flight reports: %s", exc)
        return None
    reports = []
    for key, value in zip(keys, values, strict=True):
        if value is None:
            continue  # expired between the scan and the read
        try:
            report = json.loads(value)
            reports.append(
                {
                    "router": key.decode().removeprefix(INFLIGHT_KEY_PREFIX),
                    "at": float(report["at"]),
                    "routed": [str(r) for r in report.get("routed", [])],
                    "inflight": {str(k): int(v) for k, v in report.get("inflight", {}).items()},
                }
            )
        except (ValueError, KeyError, TypeError, AttributeError):
            logger.warning("ignoring a malformed in-flight report under %s", key)
    return reports


def routing_snapshot() -> dict[str, Any]:
    """Every routable model: ready endpoints, wanted count, and why others are not ready.

    Plain data (the router's static file has the same shape), so the router process
    builds its table without holding ORM objects. An endpoint is rank 0's shard:
    ``http://<node.address>:<shard.port>``, with the replica's secret for the engine.
    """
    from django.db.models import Prefetch

    from catalog.models import Model
    from fleet.models import Replica, ReplicaState, Shard
    from fleet.selectors import LIVE_REPLICA_STATES

    models: dict[str, dict[str, Any]] = {}
    for model in Model.objects.prefetch_related("profiles"):
        models[model.name] = _entry(
            model.name, list(model.aliases), sum(p.replicas for p in model.profiles.all())
        )
    replicas = Replica.objects.filter(state__in=LIVE_REPLICA_STATES).prefetch_related(
        Prefetch("shards", queryset=Shard.objects.filter(rank=0).select_related("node"))
    )
    for replica in replicas:
        # A replica whose model left the catalog still serves until it is stopped.
        entry = models.setdefault(replica.model_name, _entry(replica.model_name, [], 0))
        draining = replica.state == ReplicaState.READY and replica.draining_since is not None
        state = "draining" if draining else replica.state
        entry["states"][state] = entry["states"].get(state, 0) + 1
        if replica.state == ReplicaState.UNPLACEABLE:
            entry["reasons"].extend(str(reason) for reason in replica.reasons or [])
        if replica.state != ReplicaState.READY:
            continue
        if draining:
            # Being replaced: it finishes what it carries, and takes nothing new.
            entry["reasons"].append(
                f"replica {str(replica.id)[:8]} is draining before it is replaced"
            )
            continue
        rank0 = next(iter(replica.shards.all()), None)
        url = _endpoint_url(rank0)
        if url is None:
            entry["reasons"].append(
                f"ready replica {str(replica.id)[:8]} has no address for rank 0 "
                "(its node sent no address, or the shard no port)"
            )
            continue
        entry["endpoints"].append(
            {"replica": str(replica.id), "url": url, "secret": replica.secret}
        )
    return {"models": list(models.values())}


def _entry(name: str, aliases: list[str], wanted: int) -> dict[str, Any]:
    return {
        "name": name,
        "aliases": aliases,
        "wanted": wanted,
        "endpoints": [],
        "states": {},
        "reasons": [],
    }


def _endpoint_url(shard) -> str | None:
    if shard is None or shard.node is None or not shard.node.address or not shard.port:
        return None
    host = shard.node.address
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"  # an IPv6 literal
    return f"http://{host}:{shard.port}"
