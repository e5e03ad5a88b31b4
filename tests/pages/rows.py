"""Fleet rows as pages show them: a node that heartbeats, a model with a stale replica."""

from __future__ import annotations

import asyncio

import redis.asyncio as aioredis
from django.conf import settings
from django.utils import timezone

from fleet.models import Node, NodeState, ReplicaState, ShardState
from protocol.inventory import UsableFabric
from router.traffic import add_traffic
from tests.factories import make_model, make_node, make_profile, make_replica, make_shard
from tests.fleet.inventories import inventory

GB = 1_000_000_000


def usage(**fields) -> dict:
    value = {
        "cpu_percent": 41.0,
        "load": [2.5, 2.0, 1.5],
        "memory_total": 64 * GB,
        "memory_used": 16 * GB,
        "memory_available": 48 * GB,
        "gpu_memory_used": {"0": 12 * GB},
        "filesystems": [
            {"path": "/var/lib/llmgw/weights", "mount": "/", "total": 500 * GB, "free": 200 * GB}
        ],
        "shards": {},
    }
    value.update(fields)
    return value


def heartbeating_node(node_id: str = "node01", **fields) -> Node:
    now = timezone.now()
    inv = inventory(
        node_id,
        gpus=1,
        weights_dir="/var/lib/llmgw/weights",
        warnings=["no AVX2: llama.cpp runs slowly", "fabric ib0: adapter mlx5_0 is DOWN"],
    ).model_dump(mode="json")
    fields.setdefault("address", "10.0.0.1")
    fields.setdefault(
        "engines",
        [
            {"engine": "llama.cpp", "version": "b5000", "path": "/x", "status": "installed"},
            {
                "engine": "vllm",
                "version": "0.9",
                "status": "failed",
                "detail": "vllm-0.9.tar.gz: sha256 mismatch",
                "managed": True,
            },
        ],
    )
    return make_node(
        node_id,
        inventory=inv,
        usage=usage(),
        usage_reported_at=now,
        last_heartbeat=now,
        registered_at=now,
        agent_version="0.1.0",
        **fields,
    )


def stale_replica_on(node: Node, model_name: str = "gemma"):
    """A ready replica started from an older profile, and a downloading one."""
    profile = make_profile(make_model(model_name), name="cpu", replicas=2)
    stale = make_replica(profile, fingerprint="old", state=ReplicaState.READY)
    make_shard(stale, node=node, state=ShardState.READY, gpus=[0], port=8001)
    fetching = make_replica(profile, state=ReplicaState.STARTING)
    make_shard(
        fetching,
        node=node,
        state=ShardState.FETCHING,
        progress={"bytes": 3_100_000_000, "total": 15_200_000_000, "rate": 41_000_000},
    )
    unplaceable = make_replica(
        profile,
        state=ReplicaState.UNPLACEABLE,
        reasons=["node01: needs 80 GB of GPU memory, has 68 GB free", "node02: lost"],
    )
    return profile, stale, fetching, unplaceable


def router_reported(counts: dict, at: float) -> None:
    """One router's report, added as inflight.py adds it every second."""

    async def add() -> None:
        client = aioredis.Redis.from_url(settings.REDIS_URL)
        try:
            await add_traffic(client, counts, at)
        finally:
            await client.aclose()

    asyncio.run(add())


def many_nodes(count: int, *, unreachable_every: int = 100, draining: tuple[str, ...] = ()):
    """``count`` nodes gpu00000… as agents leave them (register, engines, a heartbeat), in
    one statement: every ``unreachable_every``-th one unreachable, even ones in pool a and
    odd ones in pool b, on fabrics ib-0…ib-3 by their number mod 4."""
    now = timezone.now()
    # One inventory validated, then copied per node: pydantic for each of 2,000 is slow.
    described = inventory("gpu", gpus=2, weights_dir="/var/lib/llmgw/weights")
    template = described.model_dump(mode="json")
    engines = [{"engine": "llama.cpp", "version": "b5000", "path": "/x", "status": "installed"}]
    nodes = []
    for i in range(count):
        node_id, address = f"gpu{i:05d}", f"10.0.{i // 256}.{i % 256}"
        fabric = UsableFabric(name=f"ib-{i % 4}", adapters=["mlx5_0"]).model_dump(mode="json")
        unreachable = i % unreachable_every == unreachable_every - 1
        nodes.append(
            Node(
                id=node_id,
                address=address,
                state=NodeState.UNREACHABLE if unreachable else NodeState.CONNECTED,
                draining=node_id in draining,
                pool="a" if i % 2 == 0 else "b",
                inventory={
                    **template,
                    "hostname": node_id,
                    "address": address,
                    "fabrics": [fabric],
                },
                engines=engines,
                usage=usage(cpu_percent=float(i % 100)),
                usage_reported_at=now,
                last_heartbeat=now,
                registered_at=now,
                agent_version="0.1.0",
            )
        )
    return Node.objects.bulk_create(nodes, batch_size=500)
