"""LoRA adapters loaded on demand on vLLM replicas (issue 44), against a stub engine that
speaks vLLM's ``/v1/load_lora_adapter`` and ``/v1/unload_lora_adapter``
(tests/router/fake_engine.py): the router loads an adapter where a request needs it, asks
the engine for it by its model id, keeps at most ``max_loras`` on a replica by unloading
the one used least recently, prefers a replica where the adapter is loaded, and takes an
adapter another router loaded as loaded."""

from __future__ import annotations

import httpx
import pytest

from tests.router.harness import key_sha256

pytestmark = pytest.mark.process

KEY = "llmgw-test-vllm-lora-key"
ADAPTERS = [{"name": name, "source": f"/loras/{name}"} for name in ("a", "b", "c")]


def router_over(harness, engines, max_loras: int = 2, **endpoint: object) -> str:
    static = harness.static_file(
        models=[{
            "name": "qwen", "serves": ["chat"], "adapters": ADAPTERS,
            "endpoints": [{"url": engine.url, "engine": "vllm", "max_loras": max_loras,
                           **endpoint} for engine in engines],
        }],
        keys=[{"name": "lora", "sha256": key_sha256(KEY)}],
    )  # fmt: skip
    return harness.router({"LLMGW_ROUTER_STATIC": str(static)}).url


def ask(router: str, model: str) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
    return httpx.post(f"{router}/v1/chat/completions", json=body, timeout=30,
                      headers={"authorization": f"Bearer {KEY}"})  # fmt: skip


def test_an_adapter_is_loaded_where_asked_and_the_least_recently_used_makes_room(harness):
    engine = harness.engine("vllm-1")
    router = router_over(harness, [engine])
    for model in ("qwen:a", "qwen:b", "qwen:a", "qwen:c", "qwen"):
        assert ask(router, model).status_code == 200
    state = engine.state()
    # Two at most: c takes b's place, as a was used since b was loaded.
    assert state["lora_calls"] == [["load", "qwen:a"], ["load", "qwen:b"], ["unload", "qwen:b"],
                                   ["load", "qwen:c"]]  # fmt: skip
    assert state["loras"] == {"qwen:a": "/loras/a", "qwen:c": "/loras/c"}
    # vLLM serves an adapter under the name it was loaded as; the base under its own.
    asked = [r["body"]["model"] for r in state["requests"] if r["path"].endswith("completions")]
    assert asked == ["qwen:a", "qwen:b", "qwen:a", "qwen:c", "qwen"]


def test_a_replica_with_the_adapter_loaded_is_preferred(harness):
    engines = [harness.engine("vllm-1"), harness.engine("vllm-2")]
    router = router_over(harness, engines)
    for _ in range(4):
        assert ask(router, "qwen:a").status_code == 200
    loads = [call for engine in engines for call in engine.state()["lora_calls"]]
    assert loads == [["load", "qwen:a"]]  # on one replica, once


def test_an_adapter_another_router_loaded_is_taken_as_loaded(harness):
    engine = harness.engine("vllm-1")
    httpx.post(f"{engine.url}/v1/load_lora_adapter",
               json={"lora_name": "qwen:b", "lora_path": "/loras/b"})  # fmt: skip
    router = router_over(harness, [engine])
    assert ask(router, "qwen:b").status_code == 200
    assert engine.state()["loras"] == {"qwen:b": "/loras/b"}


def test_adapters_started_with_the_replica_are_never_loaded_again(harness):
    engine = harness.engine("vllm-1")
    router = router_over(harness, [engine], adapters=["a"])
    assert ask(router, "qwen:a").status_code == 200
    assert engine.state()["lora_calls"] == []
