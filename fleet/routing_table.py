"""What the router needs from the database, and the channel that says it changed.

Routers keep the routing table and the API keys in memory and reload both when a
message arrives on ``ROUTING_CHANNEL`` (a replica became ready or went away, a key was
created or revoked), with a periodic full reload as the safety net for a lost message.
Importing this module needs no configured Django: the router imports the channel name
in its static mode too, and models are imported inside the functions that read them.
"""

from __future__ import annotations

import logging
from typing import Any

from llmgw_site.redis_clients import redis_client

logger = logging.getLogger(__name__)

ROUTING_CHANNEL = "llmgw:routing"


def publish_routing_change(kind: str = "replicas") -> None:
    """Tell every router to reload now; never raises, since the change is committed anyway.

    Call it through ``transaction.on_commit`` so a router that reloads at once sees the
    change. A lost message costs at most one periodic refresh (10 s by default).
    """
    try:
        redis_client().publish(ROUTING_CHANNEL, kind)
    except Exception as exc:
        logger.warning("could not tell routers about a %s change: %s", kind, exc)


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
        entry["states"][replica.state] = entry["states"].get(replica.state, 0) + 1
        if replica.state == ReplicaState.UNPLACEABLE:
            entry["reasons"].extend(str(reason) for reason in replica.reasons or [])
        if replica.state != ReplicaState.READY:
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
