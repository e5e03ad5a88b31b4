"""What a node is told to run for one shard, built from the replica, shard and node."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import cast

from django.conf import settings
from django.db.models import Q

from fleet.models import Node, Replica, Shard, ShardState
from placement import FabricSnapshot
from protocol.engines import newest_version
from protocol.shard import AdapterSpec, FabricAssignment, LaunchMode, ShardSpec


def allocate_port(node_id: str) -> int:
    """The lowest engine port (stepping by 2: a multi-node rank 0 uses port+1 to rendezvous)
    that no live shard on the node's host holds: the node, or any node at its address
    (agents side by side on one machine, or a node back under a new id while an engine of
    its old one still runs there)."""
    address = Node.objects.filter(id=node_id).values_list("address", flat=True).first()
    on_host = Q(node_id=node_id) | Q(node__address=address) if address else Q(node_id=node_id)
    live = Shard.objects.filter(on_host, state__in=ShardState.LIVE)
    taken = set(live.values_list("port", flat=True))
    port = settings.ENGINE_PORT_BASE
    while port in taken or port + 1 in taken:
        port += 2
    return port


def version_on_nodes(engine: str, nodes: Iterable[Node]) -> str:
    """The newest version of ``engine`` every one of ``nodes`` has installed, for a replica
    whose profile pins none and whose catalog names none; "" when they share none (or
    none reported its engines: an agent too old to say runs what it finds)."""
    shared: set[str] | None = None
    for node in nodes:
        if node.engines is None:
            continue
        versions = node.installed_engines().get(engine, set())
        shared = versions if shared is None else shared & versions
    return newest_version(shared or ())


@dataclass(frozen=True)
class MeetingPoints:
    """Where the ranks of a replica across nodes find each other; empty for one node.

    Both are sent and each engine's adapter uses the one its engine needs: vLLM and SGLang
    workers join rank 0's rendezvous, llama.cpp's rank 0 connects to its workers. A worker
    listens on its fabric's own address where the fabric has one (IPoIB), else on its
    node's: rpc-server then answers on the fabric alone, not on the network others share.
    """

    rendezvous: str = ""  # rank 0's host:port+1
    workers: tuple[str, ...] = ()  # ranks 1.., each on its own engine port
    # Every rank's addresses (its node's, then its fabric's): who the walls let in.
    ranks: tuple[tuple[str, ...], ...] = ()


def meeting_points(
    shards: Sequence[Shard],
    nodes: Mapping[str, Node],
    fabrics: Sequence[FabricSnapshot | None] = (),
) -> MeetingPoints:
    """The meeting points of a replica's shards, listed in rank order; ``fabrics`` is each
    rank's side of the fabric placement chose."""
    if len(shards) < 2:
        return MeetingPoints()

    def node_address(shard: Shard) -> str:
        assert shard.node_id is not None and shard.port is not None, "a placed shard"
        return nodes[shard.node_id].address

    def fabric_address(index: int) -> str:
        fabric = fabrics[index] if index < len(fabrics) else None
        return fabric.socket_address if fabric is not None else ""

    def at(host: str, port: int) -> str:
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    ranks = tuple(
        tuple(dict.fromkeys(a for a in (node_address(shard), fabric_address(i)) if a))
        for i, shard in enumerate(shards)
    )
    return MeetingPoints(
        rendezvous=at(node_address(shards[0]), (shards[0].port or 0) + 1),
        workers=tuple(
            at(fabric_address(i) or node_address(shard), shard.port or 0)
            for i, shard in enumerate(shards)
            if i > 0
        ),
        ranks=ranks,
    )


def worker_host(node: Node, rank: int, world_size: int, fabric: FabricSnapshot | None) -> str:
    """Where a rank binds: a worker of a replica across nodes on its fabric's address when
    the fabric has one; every other rank on its node's (where routers reach rank 0)."""
    if world_size > 1 and rank > 0 and fabric is not None and fabric.socket_address:
        return fabric.socket_address
    return node.address or "127.0.0.1"


def shard_spec(
    replica: Replica,
    shard: Shard,
    node: Node,
    world_size: int,
    meeting: MeetingPoints,
    fabric: FabricSnapshot | None,
    epoch: int,
    callers: list[str] | None = None,
    adapters: Sequence[AdapterSpec] = (),
) -> ShardSpec:
    """Build the spec of one rank; ``fabric`` is the rank's side of it, as placement chose;
    ``callers`` the routers' and control planes' addresses its node's walls admit;
    ``adapters`` the LoRA adapters it loads at start (rank 0 reads them)."""
    profile = replica.profile
    assert profile is not None
    return ShardSpec(
        shard_id=shard.id,
        replica_id=str(replica.id),
        model=replica.model_name,
        source=profile.model.source,
        sha256=profile.model.sha256,
        engine=profile.engine,
        # The replica's, as the control plane resolved it: a node never picks its own.
        engine_version=replica.engine_version,
        profile=profile.name,
        fingerprint=replica.fingerprint,
        rank=shard.rank,
        world_size=world_size,
        gpus=list(shard.gpus),
        tensor_parallel=profile.tensor_parallel,
        # Rank 0 binds where the routers reach it; the node's walls let only them in.
        host=worker_host(node, shard.rank, world_size, fabric),
        port=shard.port or 0,  # a placed shard always has one
        rendezvous=meeting.rendezvous,
        workers=list(meeting.workers),
        ranks=[list(addresses) for addresses in meeting.ranks],
        callers=callers,
        fabric=_assignment(fabric) if world_size > 1 else None,
        context=profile.context,
        launch_mode=cast(LaunchMode, profile.launch_mode),  # the catalog checked it
        serves=list(profile.serves),
        args=list(profile.args),
        env=dict(profile.env),
        api_key=replica.secret,
        startup_timeout=profile.startup_timeout,
        adapters=list(adapters) if shard.rank == 0 else [],
        max_loras=profile.max_loras,
        max_lora_rank=profile.max_lora_rank,
        epoch=epoch,
    )


def _assignment(fabric: FabricSnapshot | None) -> FabricAssignment | None:
    """The fabric as the agent is told it: exactly the adapters this rank's node may use."""
    if fabric is None:
        return None
    return FabricAssignment(
        name=fabric.name, adapters=list(fabric.adapters), socket_ifname=fabric.socket_ifname,
        address=fabric.socket_address,
    )  # fmt: skip
