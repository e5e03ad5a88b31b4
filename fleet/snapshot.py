"""The fleet as placement sees it: frozen snapshots built from nodes and live shards."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta

from catalog.models import Profile
from fleet.models import Node, Shard, ShardState
from placement import (
    CONNECTED,
    DRAINING,
    FabricSnapshot,
    GpuSnapshot,
    NodeSnapshot,
    PlacementRequest,
)

# Usage older than this is not trusted for free memory; the inventory's totals are.
FRESH_USAGE = timedelta(seconds=60)
HOLDING_STATES = (ShardState.PENDING, ShardState.FETCHING, ShardState.STARTING, ShardState.READY)
LOADING_STATES = (ShardState.PENDING, ShardState.FETCHING, ShardState.STARTING)


def node_snapshots(now: datetime) -> list[NodeSnapshot]:
    """Every node with what is free on it: GPUs held by live shards are taken."""
    held_gpus: dict[str, set[int]] = defaultdict(set)
    loading_memory: dict[str, int] = defaultdict(int)
    for node_id, gpus, state, memory in Shard.objects.filter(
        state__in=HOLDING_STATES, node__isnull=False
    ).values_list("node_id", "gpus", "state", "replica__profile__memory"):
        held_gpus[node_id].update(gpus or [])
        if state in LOADING_STATES:
            # An engine still loading has not taken its memory yet; count it as taken.
            loading_memory[node_id] += memory or 0
    return [
        snapshot_of(node, held_gpus[node.id], loading_memory[node.id], now)
        for node in Node.objects.all()
    ]


def snapshot_of(node: Node, held: set[int], loading_memory: int, now: datetime) -> NodeSnapshot:
    inventory = node.inventory or {}
    usage = node.usage if node.usage_at and now - node.usage_at < FRESH_USAGE else {}
    used_by_gpu = {int(k): v for k, v in (usage.get("gpu_memory_used") or {}).items()}
    gpus = tuple(
        GpuSnapshot(
            index=gpu["index"],
            memory_total=gpu["memory_total"],
            memory_free=gpu["memory_total"] - used_by_gpu.get(gpu["index"], gpu["memory_used"]),
            nvlink_peers=frozenset(gpu.get("nvlink_peers", [])),
            uuid=gpu.get("uuid", ""),
        )
        for gpu in inventory.get("gpus", [])
        if gpu["index"] not in held
    )
    ram_free = usage.get("memory_available", inventory.get("memory_total", 0)) - loading_memory
    filesystems = usage.get("filesystems") or inventory.get("filesystems") or []
    engines = node.engines
    return NodeSnapshot(
        id=node.id,
        state=DRAINING if node.draining and node.state == CONNECTED else node.state,
        pool=node.pool,
        engines=None
        if engines is None
        else {
            name: info.get("version", "")
            for name, info in engines.items()
            if info.get("status", "installed") == "installed"
        },
        engines_installing={
            name: info["status"]
            for name, info in (engines or {}).items()
            if info.get("status", "installed") != "installed"
        },
        gpus=gpus,
        ram_free=max(0, ram_free),
        disk_free=filesystems[0].get("free", 0) if filesystems else 0,
        fabrics=tuple(
            FabricSnapshot(
                name=fabric["name"],
                active=True,
                rate_gbps=fabric.get("rate_gbps") or 0.0,
                adapters=tuple(fabric["adapters"]),
                socket_ifname=fabric.get("socket_ifname", ""),
            )
            for fabric in inventory.get("fabrics", [])
        ),
        weights=frozenset(w["source"] for w in node.weights or [] if "source" in w),
        cpu_cores=inventory.get("cpu", {}).get("cores", 0),
    )


def placement_request(replica_key: str, profile: Profile) -> PlacementRequest:
    return PlacementRequest(
        replica_key=replica_key,
        model=profile.model.name,
        profile=profile.name,
        engine=profile.engine,
        engine_version=profile.engine_version,
        gpus_per_rank=profile.gpus_per_rank,
        gpu_memory=profile.gpu_memory,
        ranks=profile.nodes,
        memory=profile.memory,
        disk=profile.disk,
        pool=profile.pool,
        weights_key=profile.model.source,
        strategy="spread" if profile.strategy == "spread" else "pack",
    )
