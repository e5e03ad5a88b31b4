"""The fleet as placement sees it: frozen snapshots built from nodes and live shards."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping
from datetime import datetime

from catalog.models import Profile
from fleet.models import Node, Shard, ShardState
from fleet.weights_map import weights_map
from placement import (
    CONNECTED,
    DRAINING,
    FabricSnapshot,
    GpuSnapshot,
    NodeSnapshot,
    PlacementRequest,
)
from protocol.inventory import FabricAdapter, UsableFabric
from protocol.shard import ranks_of

# What a node's snapshot reads of its row: every pass loads every node, and the rest
# (timestamps, the engines it was told) would only be decoded to be dropped.
SNAPSHOT_READS = (
    "id", "state", "draining", "pool", "inventory", "usage", "usage_reported_at", "engines",
    "weights", "last_heartbeat", "registered_at",
)  # fmt: skip


def node_snapshots(now: datetime) -> list[NodeSnapshot]:
    """Every node with what is free on it: GPUs held by live shards are taken."""
    held_gpus: dict[str, set[int]] = defaultdict(set)
    loading: dict[str, list[int]] = defaultdict(list)  # profiles of engines still loading
    replicas: dict[str, Counter[str]] = defaultdict(Counter)
    for node_id, gpus, state, profile_id, model, profile in Shard.objects.filter(
        state__in=ShardState.LIVE, node__isnull=False
    ).values_list(
        "node_id", "gpus", "state", "replica__profile_id", "replica__model_name",
        "replica__profile_name",
    ):  # fmt: skip
        held_gpus[node_id].update(gpus or [])
        replicas[node_id][f"{model}/{profile}"] += 1
        if state in ShardState.LOADING and profile_id is not None:
            loading[node_id].append(profile_id)
    # An engine still loading has not taken its memory yet; count it as taken, declared or
    # estimated from its model's file.
    profile_ids = {profile_id for ids in loading.values() for profile_id in ids}
    memory_of = {
        row.id: row.needs().memory
        for row in Profile.objects.filter(id__in=profile_ids).select_related("model")
    }
    loading_memory = {
        node_id: sum(memory_of.get(i, 0) for i in ids) for node_id, ids in loading.items()
    }
    nodes = list(Node.objects.only(*SNAPSHOT_READS))
    # What each node holds, its own and what it sees on shared stores.
    weights = weights_map(nodes).held
    return [
        snapshot_of(
            node,
            held_gpus[node.id],
            loading_memory.get(node.id, 0),
            now,
            weights[node.id],
            replicas[node.id],
        )  # fmt: skip
        for node in nodes
    ]


def _placeable_state(node: Node, now: datetime) -> str:
    """The node's state as placement takes it: a connected node silent past the
    unreachable timer reads as unreachable even while the mass-silence hold keeps it
    connected (``fleet.link.liveness``), so nothing new is sent to a node that may be dead."""
    if node.state == CONNECTED and node.liveness_at(now) != CONNECTED:
        return "unreachable"
    return DRAINING if node.draining and node.state == CONNECTED else node.state


def snapshot_of(
    node: Node,
    held: set[int],
    loading_memory: int,
    now: datetime,
    weights: frozenset[str],
    replicas: Mapping[str, int] | None = None,
) -> NodeSnapshot:
    """One node as placement sees it; usage that is not fresh gives way to the inventory."""
    facts, usage = node.inventory_facts(), node.usage_at(now)
    used_by_gpu = usage.gpu_memory_used if usage else {}
    gpus = tuple(
        GpuSnapshot(
            index=gpu.index,
            memory_free=gpu.memory_total - used_by_gpu.get(gpu.index, gpu.memory_used),
            nvlink_peers=frozenset(gpu.nvlink_peers),
        )
        for gpu in (facts.gpus if facts else [])
        if gpu.index not in held
    )
    memory_total = facts.memory_total if facts else 0
    ram_free = (usage.memory_available if usage else memory_total) - loading_memory
    filesystems = (usage.filesystems if usage else []) or (facts.filesystems if facts else [])
    adapters = {adapter.name: adapter for adapter in facts.adapters} if facts else {}
    installs = node.engine_installs()
    return NodeSnapshot(
        id=node.id,
        state=_placeable_state(node, now),
        pool=node.pool,
        engines=None
        if installs is None
        else {name: tuple(sorted(versions)) for name, versions in node.installed_engines().items()},
        engine_progress={
            (install.engine, install.version): install.words
            for install in installs or []
            if not install.installed
        },
        gpus=gpus,
        ram_free=max(0, ram_free),
        disk_free=filesystems[0].free if filesystems else 0,
        fabrics=tuple(
            fabric_snapshot(fabric, adapters) for fabric in (facts.fabrics if facts else [])
        ),
        weights=weights,
        replicas=dict(replicas or {}),
        firewall=facts.firewall if facts else "",
        firewall_problem=facts.firewall_problem if facts else "",
    )


def fabric_snapshot(fabric: UsableFabric, reported: Mapping[str, FabricAdapter]) -> FabricSnapshot:
    """One fabric as its node has it: the adapters with an ACTIVE port, and those without.

    An adapter the node did not describe (an agent older than adapter discovery) is taken
    as the fabric lists it, since agents advertise only adapters with an ACTIVE port.
    """
    inactive = tuple(
        name for name in fabric.adapters if name in reported and not reported[name].active_ports()
    )
    return FabricSnapshot(
        name=fabric.name,
        rate_gbps=fabric.rate_gbps or 0.0,
        adapters=tuple(name for name in fabric.adapters if name not in inactive),
        socket_ifname=fabric.socket_ifname,
        socket_address=fabric.socket_address,
        inactive_adapters=inactive,
    )


def placement_request(
    replica_key: str, profile: Profile, engine_version: str | None = None
) -> PlacementRequest:
    """What a replica of ``profile`` asks of a node. ``engine_version`` is the one the
    replica was resolved to (None: the profile's, as it resolves now); "" takes any
    installed version, and the chosen node's newest is then the one it runs."""
    if engine_version is None:
        engine_version = profile.resolved_engine_version()
    need = profile.needs()  # the declared sizes, else the estimate from the model's file
    return PlacementRequest(
        replica_key=replica_key,
        model=profile.model.name,
        profile=profile.name,
        engine=profile.engine,
        engine_version=engine_version,
        gpus_per_rank=profile.gpus_per_rank,
        gpu_memory=need.gpu_memory,
        ranks=profile.nodes,
        memory=need.memory,
        disk=profile.disk,
        workers_read_weights=ranks_of(profile.engine).workers_read_weights,
        pool=profile.pool,
        weights_key=profile.model.source,
        strategy="spread" if profile.strategy == "spread" else "pack",
        memory_basis=need.memory_basis,
        gpu_memory_basis=need.gpu_memory_basis,
        waiting_for=need.unknown,
    )
