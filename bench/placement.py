"""Benchmark placement: 1,000 replicas onto 2,000 simulated 8-GPU nodes with place_batch.

Run: .venv/bin/python -m bench.placement [--nodes 2000] [--replicas 1000] [--repeat 3]

The baseline is the naive scheduler's floor: every filter run on every node for
every request, with no scoring and no GPU choice. It is measured in the same
process on every tenth request and reported per decision, so the ratio reads
"place_batch decides N times faster than a naive pass could merely filter".
"""

from __future__ import annotations

import argparse
import random
import time

from bench.report import ratio
from placement import (
    CONNECTED,
    DRAINING,
    UNREACHABLE,
    FabricSnapshot,
    GpuSnapshot,
    NodeSnapshot,
    PlacementRequest,
    place_batch,
    refusals_for,
)

GIB = 1 << 30
FABRICS = ("ib-a", "ib-b", "ib-c", "ib-d")
MODELS = [f"hf://org/model-{n}" for n in range(12)]


def build_nodes(count: int, rng: random.Random) -> list[NodeSnapshot]:
    """Build a fleet: NVLink pairs, four fabrics, a few nodes odd in each way that matters."""
    nodes = []
    for n in range(count):
        held = set(rng.sample(range(8), rng.choice((0, 0, 0, 0, 1, 2, 4))))
        busy = rng.randrange(8) if n % 10 == 3 else -1  # a GPU some other process uses
        gpus = tuple(
            GpuSnapshot(i, (30 if i == busy else 80) * GIB, frozenset({i ^ 1}))
            for i in range(8)
            if i not in held
        )
        every = ("mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3")
        inactive = every if n % 97 == 0 else ("mlx5_3",) if n % 17 == 0 else ()
        adapters = tuple(a for a in every if a not in inactive)
        fabric = FabricSnapshot(FABRICS[n % 4], 400.0, adapters, "ib0", inactive_adapters=inactive)
        engines = {"llama.cpp": "b6000"} if n % 20 == 0 else {"vllm": "0.7.0", "llama.cpp": "b6000"}
        state = DRAINING if n % 150 == 0 else UNREACHABLE if n % 211 == 0 else CONNECTED
        nodes.append(
            NodeSnapshot(
                id=f"node{n:04d}",
                state=state,
                pool="batch" if n % 25 == 0 else "default",
                engines=engines,
                gpus=gpus,
                ram_free=rng.choice((1024, 1536, 2048)) * GIB,
                disk_free=rng.choice((2000, 4000, 8000)) * GIB,
                fabrics=(fabric,),
                weights=frozenset(rng.sample(MODELS, 2)),
            )
        )
    return nodes


def build_requests(count: int, rng: random.Random) -> list[PlacementRequest]:
    """Mix 1-GPU replicas, TP=8 on one node, TP=8 across two nodes, and a few impossible ones."""
    requests = []
    for n in range(count):
        model = rng.choice(MODELS)
        kind = rng.random()
        common = {
            "replica_key": f"replica-{n}",
            "model": model,
            "weights_key": model,
            "pool": "default",
            "memory": 64 * GIB,
            "disk": 140 * GIB,
        }
        if n % 100 == 99:  # nobody has sglang: exercises the refusal path
            request = PlacementRequest(profile="tp8", engine="sglang", gpus_per_rank=8, **common)
        elif kind < 0.60:
            request = PlacementRequest(
                profile="1gpu", engine="llama.cpp", gpus_per_rank=1, gpu_memory=40 * GIB, **common
            )
        elif kind < 0.85:
            request = PlacementRequest(
                profile="tp8", engine="vllm", gpus_per_rank=8, gpu_memory=70 * GIB, **common
            )
        else:
            request = PlacementRequest(
                profile="tp8x2",
                engine="vllm",
                gpus_per_rank=8,
                gpu_memory=70 * GIB,
                ranks=2,
                **common,
            )
        requests.append(request)
    return requests


def naive_filter_seconds(requests: list[PlacementRequest], nodes: list[NodeSnapshot]) -> float:
    started = time.perf_counter()
    for request in requests:
        for node in nodes:
            refusals_for(node, request)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--replicas", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3, help="best of this many batches")
    args = parser.parse_args()

    rng = random.Random(5)
    nodes = build_nodes(args.nodes, rng)
    requests = build_requests(args.replicas, rng)

    best = float("inf")
    for _ in range(args.repeat):
        started = time.perf_counter()
        decisions = place_batch(requests, nodes)
        best = min(best, time.perf_counter() - started)
    placed = sum(decision.placed for decision in decisions)
    gpus = sum(len(rank.gpus) for decision in decisions for rank in decision.ranks)

    sample = requests[::10]
    naive_per_decision = naive_filter_seconds(sample, nodes) / len(sample)
    per_decision = best / len(requests)

    print(
        f"{len(nodes)} nodes, {len(requests)} replicas: {placed} placed ({gpus} GPUs), "
        f"{len(requests) - placed} refused with reasons"
    )
    print(
        f"place_batch: {best:.3f} s in all, {len(requests) / best:,.0f} decisions/s "
        f"(best of {args.repeat})"
    )
    print(
        f"baseline, naive filter pass over every node ({len(sample)} requests): "
        f"{naive_per_decision * 1e3:.2f} ms per request"
    )
    faster = ratio(naive_per_decision, per_decision, ".1f")
    print(
        f"ratio: {faster}x (naive filtering alone / place_batch, "
        "per decision; above 1 means place_batch is faster)"
    )
    refused = next((decision for decision in decisions if not decision.placed), None)
    if refused is not None:
        print(f"a refusal: {refused.summary}")


if __name__ == "__main__":
    main()
