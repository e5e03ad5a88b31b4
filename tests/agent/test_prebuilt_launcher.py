"""llmgw's launcher for the prebuilt llama.cpp: every flag the adapter writes becomes the
wheel's parameter, any other flag is refused by name, and the file stands alone in the
wheel's venv. (The real wheel serving the demo: tests/processes/test_default_engine.py.)"""

from __future__ import annotations

import ast
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from agent_worker.engines import LlamaCppAdapter, prebuilt_launcher
from agent_worker.engines.prebuilt_launcher import Refused, params_of, parse, refusals
from agent_worker.supervision.shard_files import ShardFiles
from protocol.shard import ShardSpec


def spec(**fields) -> ShardSpec:
    values = dict(shard_id="s", replica_id="r", model="smollm2", source="/m.gguf",
                  engine="llama.cpp", model_path="/m.gguf", port=20000, api_key="secret",
                  context=2048, args=["--threads", "2", "--no-warmup"])  # fmt: skip
    return ShardSpec(**{**values, **fields})


def adapter_argv(shard: ShardSpec, secrets: Path | None = None) -> list[str]:
    """The command line the llama.cpp adapter writes, without the binary; with the flags
    naming its secret files, written under ``secrets``, when given."""
    command = LlamaCppAdapter().commands(shard, "/venv/bin/llama-server")[0]
    flags = ShardFiles(secrets).write_secrets("s", command.secret_files) if secrets else []
    return [*command.argv[1:], *flags]


class FakeParams(SimpleNamespace):
    """xllamacpp's CommonParams as far as the launcher touches it."""

    def __init__(self) -> None:
        super().__init__(model=SimpleNamespace(), cpuparams=SimpleNamespace(n_threads=-1),
                         cpuparams_batch=SimpleNamespace(n_threads=-1))  # fmt: skip


FAKE_XLLAMACPP = SimpleNamespace(
    CommonParams=FakeParams,
    llama_pooling_type=SimpleNamespace(
        LLAMA_POOLING_TYPE_MEAN="mean-pooling", LLAMA_POOLING_TYPE_RANK="rank-pooling"
    ),  # fmt: skip
    CommonAdapterLoraInfo=lambda path, scale: (path, scale),
)


def test_the_chat_command_line_becomes_the_wheels_parameters(tmp_path):
    params = params_of(parse(adapter_argv(spec(), tmp_path), environ={}), FAKE_XLLAMACPP)

    assert params.model.path == "/m.gguf"
    assert params.model_alias == {"smollm2"}
    assert (params.hostnames, params.port, params.api_keys) == (["127.0.0.1"], 20000, ["secret"])
    assert (params.n_ctx, params.endpoint_metrics, params.n_gpu_layers) == (2048, True, 0)
    assert params.cpuparams.n_threads == params.cpuparams_batch.n_threads == 2
    assert params.warmup is False
    # llama-server's own default without -np: four slots over one KV cache.
    assert (params.n_parallel, params.kv_unified) == (4, True)


MEAN = {"embedding": True, "pooling_type": "mean-pooling"}
RANK = {"embedding": True, "pooling_type": "rank-pooling"}


@pytest.mark.parametrize(
    ("serves", "args", "expected"),
    [(["embeddings"], ["--pooling", "mean"], MEAN), (["rerank"], [], RANK)],
    ids=["embeddings", "rerank"],
)
def test_embeddings_and_reranking_become_pooling(serves, args, expected):
    params = params_of(parse(adapter_argv(spec(serves=serves, args=args)), {}), FAKE_XLLAMACPP)

    assert {name: getattr(params, name) for name in expected} == expected


def test_the_other_flags_llmgw_and_profiles_write():
    argv = ["--parallel=2", "-tb", "1", "-b", "512", "-ub", "128", "--cache-reuse", "256",
            "--no-cache-prompt", "--lora", "a.gguf", "--lora-scaled", "b.gguf:0.5",
            "--lora-init-without-apply", "--alias", "one,two"]  # fmt: skip
    params = params_of(parse(argv, {}), FAKE_XLLAMACPP)

    assert (params.n_parallel, params.n_batch, params.n_ubatch) == (2, 512, 128)
    assert not hasattr(params, "kv_unified")  # -np given: llama-server's own KV split
    assert (params.cpuparams.n_threads, params.cpuparams_batch.n_threads) == (-1, 1)
    assert (params.n_cache_reuse, params.cache_prompt) == (256, False)
    assert params.lora_adapters == [("a.gguf", 1.0), ("b.gguf", 0.5)]
    assert params.lora_init_without_apply is True
    assert params.model_alias == {"one", "two"}


def test_the_api_key_may_come_from_a_file(tmp_path):
    key_file = tmp_path / "key"
    key_file.write_text("from-a-file\n")

    assert parse(["--api-key-file", str(key_file)], {}).values["api_keys"] == ["from-a-file"]
    # Checked before launch without reading it: the file is the engine's, not the agent's.
    assert refusals(["--api-key-file", "/nowhere"], {}) == []


def test_every_flag_it_does_not_take_is_refused_by_name_with_the_engine_that_does():
    with pytest.raises(Refused) as refused:
        parse(["-m", "/m.gguf", "--flash-attn", "on", "--mlock", "--rpc", "10.0.0.2:50052",
               "-c", "many"], {})  # fmt: skip

    flash, mlock, rpc, context = refused.value.problems
    assert flash == (
        "--flash-attn: the prebuilt llama.cpp (xllamacpp) does not take this flag; llama-server "
        "from a llama.cpp release or source build takes it: name one in the catalog's "
        "engines: and pin it with engine_version:, or remove the flag"
    )
    assert mlock.startswith("--mlock: the prebuilt llama.cpp (xllamacpp) does not take")
    assert rpc.startswith("--rpc: the prebuilt llama.cpp (xllamacpp) has no RPC backend")
    assert context.startswith("-c many: invalid literal")


def test_llama_arg_variables_are_refused_since_the_wheel_reads_none():
    assert refusals([], {"LLAMA_ARG_THREADS": "4", "HOME": "/root"}) == [
        "LLAMA_ARG_THREADS is set: the prebuilt llama.cpp (xllamacpp) reads no LLAMA_ARG_* "
        "variables; write the flag in args:"
    ]


def test_it_refuses_on_its_own_command_line_too(capsys):
    assert prebuilt_launcher.main(["--no-such-flag"]) == 2

    assert "llmgw's launcher for the prebuilt llama.cpp (xllamacpp)): --no-such-flag:" in (
        capsys.readouterr().err
    )


def test_the_launcher_imports_only_the_standard_library_and_the_wheel():
    # It runs in the wheel's venv, where llmgw is not installed.
    tree = ast.parse(Path(prebuilt_launcher.__file__).read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree)
                if isinstance(node, ast.Import) for alias in node.names}  # fmt: skip
    imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module}  # fmt: skip
    assert imported - set(sys.stdlib_module_names) == {"xllamacpp"}
