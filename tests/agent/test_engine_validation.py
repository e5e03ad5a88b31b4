"""Adapters refuse a profile before launch, in words an operator can act on."""

from __future__ import annotations

import pytest

from agent_worker.engines import get_adapter, validate_args, validate_env
from agent_worker.engines.validation import parse_rendezvous
from protocol.shard import FabricAssignment, ShardSpec


def shard(**overrides: object) -> ShardSpec:
    fields: dict[str, object] = {
        "shard_id": "s-1",
        "replica_id": "r-1",
        "model": "qwen",
        "source": "Qwen/Qwen2.5-7B-Instruct",
        "engine": "vllm",
        "port": 8001,
    }
    fields.update(overrides)
    return ShardSpec.model_validate(fields)


def gguf(**overrides: object) -> ShardSpec:
    return shard(engine="llama.cpp", model_path="/w/q.gguf", source="/w/q.gguf", **overrides)


def across(rank: int = 0, **overrides: object) -> dict[str, object]:
    fields: dict[str, object] = {"world_size": 2, "rank": rank, "rendezvous": "10.0.0.1:6380"}
    return {**fields, **overrides}


def unchecked(spec: ShardSpec, **update: object) -> ShardSpec:
    """A spec carrying what ShardSpec itself would refuse, as a corrupt state file might."""
    return spec.model_copy(update=update)


IB = FabricAssignment(name="ib-a", adapters=["mlx5_0"])

REFUSALS = [
    pytest.param(
        gguf(**across(gpus=[0], fabric=IB)),
        [
            "rank 0 of a replica across 2 nodes needs the address of each of its 1 workers, "
            "and was given 0"
        ],
        id="llama-cpp-rank-0-without-its-workers",
    ),
    pytest.param(
        gguf(host="0.0.0.0", **across(rank=1)),
        [
            "rank 1 was told to listen on '0.0.0.0', which would open rpc-server (no "
            "authentication, runs any tensor operation it is sent) to every network; set the "
            "node's own address in its agent file"
        ],
        id="llama-cpp-worker-on-every-interface",
    ),
    pytest.param(
        gguf(args=["--rpc", "10.9.9.9:50052"], **across(workers=["10.0.0.2:20000"])),
        [
            "args sets --rpc, which llmgw sets to the worker ranks placement chose; "
            "set nodes: instead; remove it"
        ],
        id="llama-cpp-rpc-peers-from-args",
    ),
    pytest.param(
        gguf().model_copy(update={"model_path": ""}),
        [
            "llama.cpp needs a GGUF file on this node, and '/w/q.gguf' was not resolved to one "
            "(model_path is empty); give the model a path or URL to a .gguf"
        ],
        id="llama-cpp-without-a-file",
    ),
    pytest.param(
        gguf(launch_mode="ray"),
        [
            "llama.cpp has no launch_mode 'ray' (llama.cpp runs its own processes, across "
            "nodes over its RPC backend); "
            "set launch_mode: native"
        ],
        id="llama-cpp-under-ray",
    ),
    pytest.param(
        shard(engine="sglang", launch_mode="ray"),
        [
            "sglang has no launch_mode 'ray' (SGLang joins its nodes itself, without Ray); "
            "set launch_mode: native"
        ],
        id="sglang-under-ray",
    ),
    pytest.param(
        unchecked(shard(), launch_mode="slurm"),
        ["vllm has no launch_mode 'slurm'; set launch_mode: native or mp or ray"],
        id="vllm-unknown-launch-mode",
    ),
    pytest.param(
        shard(gpus=[0, 1, 2, 3], tensor_parallel=3),
        [
            "tensor_parallel 3 does not divide the 4 GPUs (GPU 0, 1, 2, 3); use one of 1, 2, 4",
        ],
        id="tensor-parallel-not-dividing-gpus",
    ),
    pytest.param(
        shard(gpus=[0, 1], tensor_parallel=4),
        [
            "tensor_parallel is 4 but this shard was given 2 GPU(s) (GPU 0, 1); "
            "ask for 4 GPUs or lower tensor_parallel"
        ],
        id="tensor-parallel-beyond-gpus",
    ),
    pytest.param(
        gguf(tensor_parallel=2),
        [
            "tensor_parallel is 2 but this shard was given no GPUs; "
            "set tensor_parallel: 1 for a CPU profile or ask for GPUs"
        ],
        id="tensor-parallel-on-cpu",
    ),
    pytest.param(
        shard(gpus=[1, 1]),
        ["gpus lists GPU 1 more than once; each GPU can be used once"],
        id="gpu-twice",
    ),
    pytest.param(
        gguf(args=["--port", "9000", "--host=0.0.0.0"]),
        [
            "args sets --port, which llmgw chooses; remove it",
            "args sets --host, which llmgw chooses; remove it",
        ],
        id="args-set-port-and-host",
    ),
    pytest.param(
        gguf(args=["--api-key", "mine"]),
        [
            "args sets --api-key, which llmgw sets to the replica's own secret, "
            "which only the router sends; remove it"
        ],
        id="args-set-api-key",
    ),
    pytest.param(
        gguf(args=["-m", "/other.gguf", "-c", "8192"]),
        [
            "args sets -m, which llmgw sets to the weights it placed on this node; remove it",
            "args sets -c, which llmgw sets from the profile's context; "
            "set context: there instead; remove it",
        ],
        id="llama-cpp-args-set-model-and-context",
    ),
    pytest.param(
        shard(gpus=[0, 1], tensor_parallel=2, args=["--tensor-parallel-size", "2"]),
        [
            "args sets --tensor-parallel-size, which llmgw sets from the profile's "
            "tensor_parallel and nodes; remove it"
        ],
        id="vllm-args-set-tensor-parallel",
    ),
    pytest.param(
        shard(args=["--max-model-len=8192", "--served-model-name", "x"]),
        [
            "args sets --max-model-len, which llmgw sets from the profile's context; "
            "set context: there instead; remove it",
            "args sets --served-model-name, which llmgw sets to the model's name, "
            "which clients send; remove it",
        ],
        id="vllm-args-set-context-and-name",
    ),
    pytest.param(
        shard(engine="sglang", args=["--tp", "2", "--base-gpu-id", "4"]),
        [
            "args sets --tp, which llmgw sets from the profile's tensor_parallel and nodes; "
            "remove it",
            "args sets --base-gpu-id, which llmgw picks GPUs through CUDA_VISIBLE_DEVICES; "
            "remove it",
        ],
        id="sglang-args-set-tp-and-gpu",
    ),
    pytest.param(
        shard(env={"CUDA_VISIBLE_DEVICES": "0", "NCCL_IB_HCA": "mlx5", "HF_HOME": "/h"}),
        [
            "env sets CUDA_VISIBLE_DEVICES, which llmgw sets it from the GPUs placement "
            "chose; remove it",
            "env sets NCCL_IB_HCA, which llmgw sets it from the fabric's active adapters; "
            "fix the fabric instead; remove it",
        ],
        id="env-sets-gpus-and-adapters",
    ),
    pytest.param(
        shard(env={"RAY_ADDRESS": "auto"}),
        ["env sets RAY_ADDRESS, which llmgw points it at the replica's own Ray head; remove it"],
        id="vllm-env-sets-ray-address",
    ),
    pytest.param(
        shard(gpus=[0], fabric=IB, **across(rank=2)),
        ["rank 2 is outside a replica of 2 node(s); ranks run from 0 to 1"],
        id="rank-outside-replica",
    ),
    pytest.param(
        shard(gpus=[0], **across(rendezvous="")),
        ["a replica across 2 nodes needs rank 0's rendezvous host:port, and this shard has none"],
        id="multi-node-without-rendezvous",
    ),
    pytest.param(
        shard(gpus=[0], **across(rendezvous="10.0.0.1")),
        ["rendezvous '10.0.0.1' is not host:port with a port from 1 to 65535"],
        id="rendezvous-without-port",
    ),
    pytest.param(
        shard(**across()),
        ["vLLM spans nodes over NCCL, which needs GPUs, and rank 0 was given none"],
        id="vllm-across-nodes-on-cpu",
    ),
    pytest.param(
        shard(gpus=[0, 1, 2, 3], tensor_parallel=2, **across(rank=1)),
        [
            "across nodes each vLLM node runs one tensor-parallel group: tensor_parallel is 2 "
            "but rank 1 was given 4 GPUs; set tensor_parallel to the GPUs per node"
        ],
        id="vllm-across-nodes-with-spare-gpus",
    ),
    pytest.param(
        shard(engine="sglang", gpus=[0, 1], **across()),
        [
            "across nodes each SGLang node runs tensor_parallel GPUs: tensor_parallel is 1 "
            "but rank 0 was given 2 GPUs; set tensor_parallel to the GPUs per node"
        ],
        id="sglang-across-nodes-with-spare-gpus",
    ),
    pytest.param(
        unchecked(shard(), args=[8, "", " --x", "--dtype bfloat16"]),
        [
            "args item 1 is 8 (int); quote it so it is a string",
            "args item 2 is empty; remove it",
            "args item 3 ' --x' has spaces around it; remove them",
            "args item 4 '--dtype bfloat16' is a flag and its value in one item; "
            "write them as two: ['--dtype', 'bfloat16']",
        ],
        id="malformed-args",
    ),
]


@pytest.mark.parametrize(("spec", "problems"), REFUSALS)
def test_profile_is_refused_with_every_problem_named(spec, problems):
    assert get_adapter(spec.engine).validate(spec) == problems


ACCEPTED = [
    pytest.param(gguf(), id="llama-cpp-cpu"),
    pytest.param(gguf(gpus=[0, 1], args=["-ngl", "20", "--flash-attn", "on"]), id="llama-gpus"),
    pytest.param(shard(gpus=[0, 1, 2, 3], tensor_parallel=4), id="vllm-one-node"),
    pytest.param(shard(gpus=[0, 1, 2, 3, 4, 5, 6, 7], tensor_parallel=4), id="vllm-two-stages"),
    pytest.param(
        shard(gpus=[0, 1], tensor_parallel=2, launch_mode="ray", **across(rank=1)),
        id="vllm-ray-worker",
    ),
    pytest.param(
        shard(gpus=[0], launch_mode="mp", **across(rendezvous="[fd00::1]:29500")),
        id="vllm-mp-ipv6-rendezvous",
    ),
    pytest.param(
        shard(engine="sglang", gpus=[0, 1], tensor_parallel=2, **across()), id="sglang-across-nodes"
    ),
    pytest.param(gguf(**across(workers=["10.0.0.2:20000"])), id="llama-cpp-rank-0-across-nodes"),
    pytest.param(
        gguf(host="10.0.0.2", **across(rank=1)).model_copy(update={"model_path": ""}),
        id="llama-cpp-worker-needs-no-file",
    ),
    pytest.param(
        shard(args=['--chat-template-kwargs={"enable_thinking": false}']),
        id="flag-with-a-spaced-value",
    ),
]


@pytest.mark.parametrize("spec", ACCEPTED)
def test_sound_profile_is_accepted(spec):
    assert get_adapter(spec.engine).validate(spec) == []


def test_a_shard_for_another_engine_is_refused():
    assert get_adapter("vllm").validate(shard(engine="sglang")) == [
        "this shard is for engine 'sglang', not vllm"
    ]


def test_args_that_are_not_a_list_are_refused_before_anything_else():
    assert validate_args("--dtype bfloat16") == ["args must be a list of strings, not str"]


def test_env_names_and_values_must_be_strings_a_process_can_hold():
    assert validate_env({"A=B": "x", "N": 1, "": "y", "OK": "fine"}) == [
        "env name 'A=B' holds '=', a space or a NUL; no process can get it",
        "env N is 1 (int); quote it so it is a string",
        "env has a key ''; names must be non-empty strings",
    ]
    assert validate_env(["A=1"]) == ["env must be a mapping of names to strings, not list"]


@pytest.mark.parametrize(
    ("value", "parsed"),
    [("10.0.0.1:6380", ("10.0.0.1", 6380)), ("[fd00::1]:29500", ("fd00::1", 29500))],
)
def test_rendezvous_is_split_into_host_and_port(value, parsed):
    assert parse_rendezvous(value) == parsed


@pytest.mark.parametrize("value", ["", "host", ":80", "host:0", "host:70000", "host:x"])
def test_rendezvous_without_a_usable_port_is_refused(value):
    with pytest.raises(ValueError, match="is not host:port"):
        parse_rendezvous(value)
