"""Every filter's refusal, word for word, and how refusals roll up into one line."""

from __future__ import annotations

from typing import Any

import pytest

from core.humanize import format_bytes, format_need_and_have
from placement import place
from tests.placement.builders import GIB, fabric, gpus, node, request

INSTALLING = "installing: downloading vllm 0.8.1 wheels (40%)"
FAILED = "failed: libgomp.so.1 not found"

REFUSALS: list[tuple[str, dict[str, Any], dict[str, Any], list[str]]] = [
    ("draining", {"state": "draining"}, {}, ["node01: draining: takes no new replicas"]),
    ("unreachable", {"state": "unreachable"}, {}, ["node01: unreachable: no recent heartbeat"]),
    ("lost", {"state": "lost"}, {}, ["node01: lost: no heartbeat for too long"]),
    (
        "unknown-state",
        {"state": "booting"},
        {},
        ["node01: booting: only connected nodes take replicas"],
    ),
    (
        "engine-installing-in-the-nodes-words",
        {"engines": {"llama.cpp": ("b6000",)}, "engine_progress": {("vllm", "0.8.1"): INSTALLING}},
        {},
        [f"node01: vllm 0.8.1 {INSTALLING}"],
    ),
    (
        "engine-failed-in-the-nodes-words",
        {"engine_progress": {("vllm", "0.8.1"): FAILED, ("vllm", "0.9.0"): INSTALLING}},
        {"engine_version": "0.8.1"},
        [f"node01: vllm 0.8.1 {FAILED}"],
    ),
    ("engines-probed-none", {"engines": {}}, {}, ["node01: engine vllm not installed"]),
    (
        "engine-other-version",
        {},
        {"engine_version": "0.8.1"},
        ["node01: engine vllm 0.7.0 installed, needs 0.8.1"],
    ),
    ("other-pool", {"pool": "batch"}, {"pool": "chat"}, ["node01: in pool batch, needs pool chat"]),
    ("no-pool", {}, {"pool": "chat"}, ["node01: in no pool, needs pool chat"]),
    (
        "too-few-gpus",
        {"gpus": gpus(1)},
        {"gpus_per_rank": 2},
        ["node01: needs 2 GPUs with 40 GiB free, has 1"],
    ),
    (
        "gpus-without-memory",
        {"gpus": gpus(4, free=30 * GIB)},
        {"gpus_per_rank": 2},
        ["node01: needs 2 GPUs with 40 GiB free, has 0"],
    ),
    (
        "too-few-gpus-any-memory",
        {"gpus": gpus(1)},
        {"gpus_per_rank": 2, "gpu_memory": 0},
        ["node01: needs 2 free GPUs, has 1"],
    ),
    ("no-gpus", {"gpus": ()}, {}, ["node01: needs 1 GPU with 40 GiB free, has 0"]),
    ("ram", {"ram_free": 12 * GIB}, {}, ["node01: needs 64 GiB RAM free, has 12 GiB"]),
    (
        "ram-estimated-from-the-model-file",
        {"ram_free": 12 * GIB},
        {
            "memory_basis": "estimated from its file: weights 40, KV cache at 8192 tokens 20, "
            "buffers 4"
        },
        [
            "node01: needs 64 GiB RAM free (estimated from its file: weights 40, KV cache at 8192 "
            "tokens 20, buffers 4), has 12 GiB"
        ],
    ),
    (
        "gpu-memory-estimated-from-the-model-file",
        {"gpus": gpus(4, free=30 * GIB)},
        {
            "gpu_memory_basis": "estimated from its file: weights 30, KV cache at 8192 tokens 8, "
            "buffers 2"
        },
        [
            "node01: needs 1 GPU with 40 GiB free (estimated from its file: weights 30, KV cache "
            "at 8192 tokens 8, buffers 2), has 0"
        ],
    ),
    (
        "memory-need-not-known-yet",
        {},
        {
            "waiting_for": "the memory it needs is not known yet (its header at "
            "https://example.com/m.gguf is being read); set gpu_memory: to place it before the "
            "estimate comes"
        },
        [
            "node01: the memory it needs is not known yet (its header at "
            "https://example.com/m.gguf is being read); set gpu_memory: to place it before the "
            "estimate comes"
        ],
    ),
    (
        "disk",
        {"disk_free": 80 * GIB},
        {},
        ["node01: needs 140 GiB disk free for weights, has 80 GiB"],
    ),
    (
        "disk-one-byte-short",
        {"disk_free": 140 * GIB - 1},
        {},
        ["node01: needs 150,323,855,360 bytes disk free for weights, has 150,323,855,359 bytes"],
    ),
    (
        "several-shortfalls-together",
        {"gpus": gpus(1), "ram_free": 12 * GIB, "disk_free": 80 * GIB, "state": "draining"},
        {"gpus_per_rank": 2},
        [
            "node01: draining: takes no new replicas",
            "node01: needs 2 GPUs with 40 GiB free, has 1",
            "node01: needs 64 GiB RAM free, has 12 GiB",
            "node01: needs 140 GiB disk free for weights, has 80 GiB",
        ],
    ),
    (
        "multi-node-without-fabric",
        {},
        {"ranks": 2},
        [
            "needs 2 nodes on one fabric; no node has an active fabric",
            "node01: no active fabric for a 2-node replica",
        ],
    ),
    (
        "multi-node-inactive-adapter",
        {"fabrics": (fabric("ib-a", (), inactive=("mlx5_0",)),)},
        {"ranks": 2},
        [
            "needs 2 nodes on one fabric; ib-a has 0 eligible nodes",
            "node01: no active fabric for a 2-node replica (ib-a: mlx5_0 not active)",
        ],
    ),
    (
        "multi-node-fabric-without-adapter",
        {"fabrics": (fabric("ib-a", ()),)},
        {"ranks": 2},
        [
            "needs 2 nodes on one fabric; ib-a has 0 eligible nodes",
            "node01: no active fabric for a 2-node replica (ib-a: no adapter on this node)",
        ],
    ),
    (
        "multi-node-where-engine-ports-cannot-be-walled",
        {
            "fabrics": (fabric(),),
            "firewall": "unavailable",
            "firewall_problem": "nft is not installed (apt install nftables)",
        },
        {"ranks": 2},
        [
            "needs 2 nodes on one fabric; ib-a has 0 eligible nodes",
            "node01: cannot wall engine ports: nft is not installed (apt install nftables); a "
            "2-node replica's rpc-server and rendezvous ports would be open to the network: "
            "install nftables on it, or set LLMGW_AGENT_FIREWALL=off there to accept that",
        ],
    ),
]


@pytest.mark.parametrize(
    ("node_changes", "request_changes", "reasons"),
    [case[1:] for case in REFUSALS],
    ids=[case[0] for case in REFUSALS],
)
def test_refusal_reads_exactly(
    node_changes: dict[str, Any], request_changes: dict[str, Any], reasons: list[str]
) -> None:
    decision = place(request(**request_changes), [node(**node_changes)])
    assert not decision.placed
    assert decision.reasons == reasons


PASSES: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    ("old-agent-sent-no-engine-list", {"engines": None}, {}),
    ("any-version-when-none-asked", {"engines": {"vllm": ("0.6.0",)}}, {}),
    ("one-of-two-versions", {"engines": {"vllm": ("0.6.0", "0.7.0")}}, {"engine_version": "0.6.0"}),
    ("same-version", {}, {"engine_version": "0.7.0"}),
    ("no-pool-asked", {"pool": "batch"}, {}),
    (
        "disk-skipped-when-weights-held",
        {"disk_free": 0, "weights": frozenset({"hf://org/chat"})},
        {},
    ),
    (
        "disk-skipped-when-weights-being-fetched",
        {"disk_free": 0, "weights_fetching": frozenset({"hf://org/chat"})},
        {},
    ),
    ("cpu-only-replica", {"gpus": ()}, {"gpus_per_rank": 0, "gpu_memory": 0}),
    ("one-node-replica-where-ports-cannot-be-walled", {"firewall": "unavailable"}, {}),
    ("exactly-enough", {"ram_free": 64 * GIB, "disk_free": 140 * GIB, "gpus": gpus(1)}, {}),
]


@pytest.mark.parametrize(
    ("node_changes", "request_changes"),
    [case[1:] for case in PASSES],
    ids=[case[0] for case in PASSES],
)
def test_node_passes(node_changes: dict[str, Any], request_changes: dict[str, Any]) -> None:
    decision = place(request(**request_changes), [node(**node_changes)])
    assert decision.placed, decision.reasons
    assert decision.summary.startswith("1/1 nodes available; placed on node01")


def test_summary_rolls_up_refusals_by_shortfall() -> None:
    short_of_memory = [node(f"node0{n}", gpus=gpus(8, free=20 * GIB)) for n in range(1, 5)]
    no_engine = [node(f"node0{n}", engines={}) for n in range(5, 8)]

    decision = place(request(), short_of_memory + no_engine)

    assert decision.summary == "0/7 nodes available: 4 lack free GPU memory, 3 lack engine vllm"
    assert decision.shortfalls == {"lack free GPU memory": 4, "lack engine vllm": 3}
    assert len(decision.reasons) == 7


def test_summary_counts_a_node_under_every_shortfall_and_speaks_of_one_node_singly() -> None:
    nodes = [
        node("node01", state="draining", ram_free=GIB),
        node("node02", gpus=gpus(8, free=GIB)),
        node("node03", gpus=gpus(8, free=GIB), engines={"vllm": ("0.6.0",)}),
    ]

    decision = place(request(engine_version="0.7.0"), nodes)

    assert decision.summary == (
        "0/3 nodes available: 2 lack free GPU memory, "
        "1 is draining, 1 lacks engine vllm 0.7.0, 1 lacks free RAM"
    )


def test_summary_of_an_empty_fleet() -> None:
    assert place(request(), []).summary == "0/0 nodes available: no nodes to place on"


def test_reasons_are_grouped_by_node_in_id_order() -> None:
    nodes = [node("node02", engines={}), node("node01", ram_free=0, engines={})]

    assert place(request(), nodes).reasons == [
        "node01: engine vllm not installed",
        "node01: needs 64 GiB RAM free, has 0 B",
        "node02: engine vllm not installed",
    ]


@pytest.mark.parametrize(
    ("size", "text"),
    [
        (0, "0 B"),
        (512, "512 B"),
        (16 * (1 << 20), "16 MiB"),
        (40 * GIB, "40 GiB"),
        (3 * GIB // 2, "1.5 GiB"),
        (2 * (1 << 40), "2 TiB"),
    ],
    ids=["zero", "bytes", "mib", "gib", "fraction", "tib"],
)
def test_format_bytes(size: int, text: str) -> None:
    assert format_bytes(size) == text


def test_need_and_have_never_read_the_same_when_they_differ() -> None:
    assert format_need_and_have(40 * GIB, 12 * GIB) == ("40 GiB", "12 GiB")
    assert format_need_and_have(40 * GIB, 40 * GIB - 60 * (1 << 20)) == ("40 GiB", "39.9 GiB")
    assert format_need_and_have(40 * GIB, 40 * GIB - (1 << 20)) == ("40 GiB", "39.999 GiB")
    assert format_need_and_have(40 * GIB, 40 * GIB) == ("40 GiB", "40 GiB")
