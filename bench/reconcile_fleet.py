"""The fleet of bench/reconcile_scale.py, written straight into its own database.

Nodes as their agents would have described themselves (8 GPUs, a fabric, engines,
weights, a fresh heartbeat), a catalog of models with one profile each, and replicas
already placed by the real placement (``node_snapshots`` and ``place_batch``) and running,
written with bulk inserts: the bench measures the passes, not the build.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

GIB = 1 << 30
NODE_PREFIX = "bench-node-"
FABRICS = ("ib-a", "ib-b", "ib-c", "ib-d")
ENGINES = (("llama.cpp", "b6000"), ("vllm", "0.7.0"))
ADAPTERS = ("mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3")
WEIGHTS_DIR = "/var/lib/llmgw/weights"


@dataclass
class Built:
    nodes: int
    models: int
    wanted: int
    ready: int
    starting: int
    unplaceable: int
    shards: int


def node_id(n: int) -> str:
    return f"{NODE_PREFIX}{n:05d}"


def clear() -> None:
    """Empty every table the bench writes; the database is the bench's own."""
    from django.contrib.auth.models import User
    from django.db import connection

    from audit.models import Event
    from catalog.models import Engine, Model, Profile
    from fleet.models import Node, Replica, Shard

    tables = [m._meta.db_table for m in (Shard, Replica, Node, Profile, Model, Engine, Event)]
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {', '.join(tables)} CASCADE")  # noqa: S608 (our table names)
    User.objects.filter(username__startswith="bench-").delete()


def _inventory(n: int):
    from protocol.inventory import (
        AdapterPort,
        Cpu,
        FabricAdapter,
        Filesystem,
        Gpu,
        Inventory,
        UsableFabric,
    )

    return Inventory(
        hostname=node_id(n),
        address=f"10.{n // 65536}.{n // 256 % 256}.{n % 256}",
        os="Ubuntu 22.04",
        kernel="6.5.0",
        arch="x86_64",
        cpu=Cpu(model="AMD EPYC 9654", cores=192, arch="x86_64", vector_extensions=["avx2"]),
        memory_total=2048 * GIB,
        gpus=[
            Gpu(
                index=i,
                uuid=f"GPU-{n:05d}-{i}",
                name="NVIDIA H100 80GB HBM3",
                memory_total=80 * GIB,
                memory_used=512 << 20,
                compute_capability="9.0",
                pci_bus_id=f"0000:{i + 1:02x}:00.0",
                nvlink_peers=[j for j in range(8) if j != i],
            )
            for i in range(8)
        ],  # fmt: skip
        nvidia_driver="550.54.15",
        cuda_version="12.4",
        firewall="nftables",  # its agent walls engine ports: the pass tells it the callers
        fabrics=[
            UsableFabric(
                name=FABRICS[n % 4], adapters=list(ADAPTERS), rate_gbps=400.0, socket_ifname="ib0"
            )
        ],  # fmt: skip
        adapters=[
            FabricAdapter(
                name=name,
                interfaces=["ib0"] if name == ADAPTERS[0] else [],
                ports=[
                    AdapterPort(number=1, state="ACTIVE", rate_gbps=400.0, link_layer="InfiniBand")
                ],
            )
            for name in ADAPTERS
        ],  # fmt: skip
        weights_dir=WEIGHTS_DIR,
        filesystems=[Filesystem(path=WEIGHTS_DIR, mount="/", total=15000 * GIB, free=9000 * GIB)],
    )


def _usage(gpu_used: dict[int, int], shards: dict[str, dict]) -> dict:
    from protocol.inventory import Filesystem, NodeUsage, ShardUsage

    return NodeUsage(
        cpu_percent=23.5,
        load=(12.0, 11.5, 11.0),
        memory_total=2048 * GIB,
        memory_used=300 * GIB,
        memory_available=1748 * GIB,
        gpu_memory_used={i: gpu_used.get(i, 512 << 20) for i in range(8)},
        filesystems=[Filesystem(path=WEIGHTS_DIR, mount="/", total=15000 * GIB, free=9000 * GIB)],
        shards={shard_id: ShardUsage(**use) for shard_id, use in shards.items()},
    ).model_dump(mode="json")


def _profile_shape(m: int, models: int) -> dict:
    """One model's profile: mostly small llama.cpp ones, some vLLM TP2/4/8, a few across
    two nodes, and a few no node can take (nobody has SGLang): those stay unplaceable."""
    if m >= models - max(1, models // 60):
        return {"engine": "sglang", "gpus_per_rank": 1, "gpu_memory": 20 * GIB}
    kind = m % 10
    if kind < 6:
        return {"engine": "llama.cpp", "gpus_per_rank": 1, "gpu_memory": 20 * GIB}
    if kind < 8:
        return {"engine": "vllm", "gpus_per_rank": 2, "tensor_parallel": 2, "gpu_memory": 60 * GIB}
    if kind == 8:
        return {"engine": "vllm", "gpus_per_rank": 8, "tensor_parallel": 8, "gpu_memory": 70 * GIB}
    if m % 30 == 9:
        return {"engine": "vllm", "gpus_per_rank": 8, "tensor_parallel": 8, "nodes": 2,
                "gpu_memory": 70 * GIB}  # fmt: skip
    return {"engine": "vllm", "gpus_per_rank": 4, "tensor_parallel": 4, "gpu_memory": 60 * GIB}


def build(nodes: int, models: int, wanted: int, now: datetime) -> Built:
    """Write the fleet; every node heard at ``now``; ~1% of placed replicas still starting."""
    from catalog.models import Engine, Model, Profile, newest_engine_versions
    from fleet.models import Node, Replica, ReplicaState, Shard, ShardState
    from fleet.pki.keys import replica_secret
    from fleet.planning.snapshot import node_snapshots, placement_request
    from fleet.reconcile.engines import engines_digest, wanted_engines
    from placement import place_batch

    clear()
    Engine.objects.bulk_create([Engine(name=name, version=version) for name, version in ENGINES])
    digest = engines_digest(wanted_engines())
    catalog = Model.objects.bulk_create(
        [
            Model(name=f"bench-model-{m:03d}", aliases=[f"bm{m}"],
                  source=f"/models/bench-{m:03d}.gguf" if m % 10 < 6 else f"org/bench-{m:03d}")
            for m in range(models)
        ]
    )  # fmt: skip
    per, extra = divmod(wanted, models)
    Profile.objects.bulk_create(
        [
            Profile(model=model, name="default", replicas=per + (1 if m < extra else 0),
                    memory=32 * GIB, disk=40 * GIB, concurrency=8, **_profile_shape(m, models))
            for m, model in enumerate(catalog)
        ]
    )  # fmt: skip
    profiles = list(Profile.objects.select_related("model").order_by("model__name"))
    installs = [{"engine": e, "version": v, "path": f"/opt/{e}/{v}/bin", "status": "installed",
                 "detail": "", "managed": True} for e, v in ENGINES]  # fmt: skip
    Node.objects.bulk_create(
        [
            Node(
                id=node_id(n), address=f"10.{n // 65536}.{n // 256 % 256}.{n % 256}",
                state="connected", draining=n % 150 == 149, registered_at=now - timedelta(hours=1),
                last_heartbeat=now, agent_version="0.9.0",
                inventory=_inventory(n).model_dump(mode="json"),
                engines=installs if n % 20 else installs[:1], engines_told=digest,
                engines_told_at=now, usage=_usage({}, {}), usage_reported_at=now,
            )
            for n in range(nodes)
        ],
        batch_size=500,
    )  # fmt: skip

    # Place every wanted replica with the real placement, as the reconciler would have.
    newest = newest_engine_versions()
    pending = [
        (profile, uuid.uuid4()) for profile in profiles for _ in range(profile.replicas)
    ]  # fmt: skip
    decisions = place_batch(
        [placement_request(str(rid), p, p.resolved_engine_version(newest)) for p, rid in pending],
        node_snapshots(now),
    )
    replicas, shards = [], []
    gpu_used: dict[str, dict[int, int]] = {}
    shard_use: dict[str, dict[str, dict]] = {}
    weights: dict[str, set[str]] = {}
    ports: dict[str, int] = {}
    counts = {"ready": 0, "starting": 0, "unplaceable": 0}
    for k, ((profile, rid), decision) in enumerate(zip(pending, decisions, strict=True)):
        state = (
            ReplicaState.UNPLACEABLE if not decision.placed
            else ReplicaState.STARTING if k % 100 == 50 else ReplicaState.READY
        )  # fmt: skip
        counts[str(state)] += 1
        replicas.append(
            Replica(
                id=rid, model_name=profile.model.name, profile_name=profile.name,
                profile=profile, fingerprint=profile.fingerprint(newest), engine=profile.engine,
                engine_version=profile.resolved_engine_version(newest), state=state,
                reasons=[] if decision.placed else [decision.summary, *decision.reasons_in_brief],
                secret=replica_secret(rid), starting_since=now,
            )
        )  # fmt: skip
        for rank in decision.ranks:
            port = ports.get(rank.node, 20000)
            ports[rank.node] = port + 2
            shard_id = uuid.uuid4().hex
            shards.append(
                Shard(
                    id=shard_id, replica_id=rid, rank=rank.rank, node_id=rank.node,
                    gpus=list(rank.gpus), port=port, pid=10000 + k, status_seq=3,
                    state=ShardState.READY if state == ReplicaState.READY else ShardState.STARTING,
                )
            )  # fmt: skip
            for gpu in rank.gpus:
                gpu_used.setdefault(rank.node, {})[gpu] = profile.gpu_memory
            shard_use.setdefault(rank.node, {})[shard_id] = {"cpu_cores": 1.5, "rss": 8 * GIB}
            weights.setdefault(rank.node, set()).add(profile.model.source)
    Replica.objects.bulk_create(replicas, batch_size=500)
    Shard.objects.bulk_create(shards, batch_size=500)
    # What each node's heartbeat and weights list say, now that engines run there.
    changed = []
    for node in Node.objects.filter(id__in=list(shard_use)).only("id"):
        node.usage = _usage(gpu_used.get(node.id, {}), shard_use.get(node.id, {}))
        node.weights = [
            {"source": source, "path": f"{WEIGHTS_DIR}/{source.strip('/').replace('/', '--')}",
             "size": 40 * GIB, "fetched": True, "store": ""}
            for source in sorted(weights.get(node.id, ()))
        ]  # fmt: skip
        changed.append(node)
    Node.objects.bulk_update(changed, ["usage", "weights"], batch_size=500)
    return Built(nodes=nodes, models=models, wanted=wanted, shards=len(shards), **counts)


def heard_now(now: datetime) -> None:
    """Every node heard at ``now``, as the heartbeat batcher writes it: one UPDATE."""
    from fleet.models import Node

    Node.objects.update(last_heartbeat=now, usage_reported_at=now)


def registers(epoch: int = 1) -> list[tuple[str, object]]:
    """Each node's register as its agent sends it after a control plane restart: its
    inventory, engines, weights and every shard it runs, with the spec it was given."""
    from fleet.models import Node, Replica, ShardState
    from fleet.planning.shard_specs import meeting_points, shard_spec
    from protocol import messages
    from protocol.engines import EngineInstall
    from protocol.inventory import Inventory

    nodes = {node.id: node for node in Node.objects.all()}
    running: dict[str, list[messages.ReportedShard]] = {}
    placed = Replica.objects.exclude(shards=None).select_related("profile__model")
    for replica in placed.prefetch_related("shards"):
        shards = list(replica.shards.all())
        meeting = meeting_points(shards, nodes)
        for shard in shards:
            node = nodes[shard.node_id]
            spec = shard_spec(replica, shard, node, len(shards), meeting, None, epoch)
            running.setdefault(node.id, []).append(
                messages.ReportedShard(
                    spec=spec, state=ShardState(shard.state), pid=shard.pid, seq=shard.status_seq
                )
            )
    return [
        (
            node.id,
            messages.Register(
                agent_version=node.agent_version,
                inventory=Inventory.model_validate(node.inventory),
                engines_probed=True,
                engines=[EngineInstall.model_validate(e) for e in node.engines or []],
                weights=[messages.WeightFile.model_validate(w) for w in node.weights],
                shards=running.get(node.id, []),
            ),
        )
        for node in nodes.values()
    ]
