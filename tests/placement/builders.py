"""Small builders for placement tests: a node or a request with only what a test changes."""

from __future__ import annotations

from typing import Any

from placement import FabricSnapshot, GpuSnapshot, NodeSnapshot, PlacementRequest

GIB = 1 << 30


def gpus(
    count: int = 8,
    free: int = 80 * GIB,
    links: dict[int, set[int]] | None = None,
    start: int = 0,
) -> tuple[GpuSnapshot, ...]:
    """Free 80 GiB GPUs numbered from `start`; `links` gives each index its NVLink peers."""
    links = links or {}
    return tuple(
        GpuSnapshot(index, free, frozenset(links.get(index, ())))
        for index in range(start, start + count)
    )


def paired(indices: list[int]) -> dict[int, set[int]]:
    """NVLink bridges joining 0-1, 2-3, ... as on a PCIe box."""
    return {index: {index ^ 1} for index in indices}


def fabric(
    name: str = "ib-a",
    adapters: tuple[str, ...] = ("mlx5_0",),
    *,
    rate: float = 400.0,
    ifname: str = "ib0",
    inactive: tuple[str, ...] = (),
) -> FabricSnapshot:
    return FabricSnapshot(name, rate, adapters, ifname, inactive_adapters=inactive)


def node(node_id: str = "node01", **changes: Any) -> NodeSnapshot:
    """A connected node with vLLM 0.7.0, eight free 80 GiB GPUs, 512 GiB RAM, 2000 GiB disk."""
    values: dict[str, Any] = {
        "state": "connected",
        "engines": {"vllm": ("0.7.0",)},
        "gpus": gpus(),
        "ram_free": 512 * GIB,
        "disk_free": 2000 * GIB,
    }
    values.update(changes)
    return NodeSnapshot(id=node_id, **values)


def request(**changes: Any) -> PlacementRequest:
    """One replica of "chat" on vLLM asking for a GPU with 40 GiB free and 64 GiB RAM."""
    values: dict[str, Any] = {
        "replica_key": "chat-0",
        "model": "chat",
        "profile": "default",
        "engine": "vllm",
        "gpus_per_rank": 1,
        "gpu_memory": 40 * GIB,
        "memory": 64 * GIB,
        "disk": 140 * GIB,
        "weights_key": "hf://org/chat",
    }
    values.update(changes)
    return PlacementRequest(**values)
