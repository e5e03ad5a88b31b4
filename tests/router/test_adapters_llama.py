"""LoRA adapters answered by real llama-servers through a real router (issue 44's proof).

Two llama-servers run the SmolLM2 demo model with two adapters the test writes
(tests/support/lora_gguf.py), loaded with ``--lora-init-without-apply``, in the opposite
order on each: an adapter's id differs between them, and the router names each replica's
own. At temperature 0 the base model and ``smollm2-135m:test`` answer differently, the
adapter answers the same on both replicas, and the base answers as a llama-server with no
adapter at all does (llama.cpp applies a loaded adapter to a request that does not name
it: DESIGN.md, "Pitfalls"). Nothing here is timed.
"""

from __future__ import annotations

import httpx
import pytest

from tests.router.harness import Harness, key_sha256, llama_server
from tests.support.lora_gguf import write_lora_gguf
from tests.support.metrics import metrics_auth

pytestmark = pytest.mark.process

KEY = "llmgw-test-adapters-key"
BASE = "smollm2-135m"
ASK = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A router over two llama-servers with both adapters, and one with none."""
    root = tmp_path_factory.mktemp("adapters-llama")
    test, other = write_lora_gguf(root / "test.gguf", 1), write_lora_gguf(root / "other.gguf", 2)
    harness = Harness(root)
    try:
        first = llama_server(harness, root, "--lora", str(test), "--lora", str(other),
                             "--lora-init-without-apply")  # fmt: skip
        second = llama_server(harness, root, "--lora", str(other), "--lora", str(test),
                              "--lora-init-without-apply")  # fmt: skip
        bare = llama_server(harness, root)
        static = harness.static_file(
            models=[
                {"name": BASE, "serves": ["chat"],
                 "adapters": [{"name": "test", "aliases": ["smol-test"]}, {"name": "other"}],
                 "endpoints": [
                     {"url": first, "engine": "llama.cpp", "adapters": ["test", "other"]},
                     {"url": second, "engine": "llama.cpp", "adapters": ["other", "test"]},
                 ]},
                {"name": "bare", "serves": ["chat"], "endpoints": [{"url": bare}]},
            ],
            keys=[{"name": "lora", "sha256": key_sha256(KEY)}],
        )  # fmt: skip
        router = harness.router({"LLMGW_ROUTER_STATIC": str(static)})
        yield router.url, (first, second)
    finally:
        harness.cleanup()


def answer(url: str, model: str, headers: dict[str, str] | None = None) -> str:
    body = {"model": model, "messages": ASK, "temperature": 0, "max_tokens": 16}
    reply = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120,
                       headers=headers or {"authorization": f"Bearer {KEY}"})  # fmt: skip
    assert reply.status_code == 200, reply.text
    return reply.json()["choices"][0]["message"]["content"]


def test_the_adapter_answers_unlike_its_base_and_alike_on_both_replicas(served):
    router, (first, second) = served
    base = answer(router, BASE)
    adapted = answer(router, f"{BASE}:test")
    assert adapted != base
    # Each replica asked directly, with its own id for the adapter: the router's answer.
    own = {first: 0, second: 1}
    for url, index in own.items():
        lora = [{"id": i, "scale": 1.0 if i == index else 0.0} for i in range(2)]
        body = {"model": BASE, "messages": ASK, "temperature": 0, "max_tokens": 16, "lora": lora}
        direct = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120).json()
        assert direct["choices"][0]["message"]["content"] == adapted
    assert answer(router, "smol-test") == adapted  # its alias
    assert answer(router, f"{BASE}:other") not in (adapted, base)


def test_the_base_model_answers_as_a_server_without_adapters(served):
    router, _replicas = served
    assert answer(router, BASE) == answer(router, "bare")


def test_models_lists_each_adapter_with_its_parent(served):
    router, _replicas = served
    listed = httpx.get(f"{router}/v1/models", headers={"authorization": f"Bearer {KEY}"})
    parents = {entry["id"]: entry.get("parent") for entry in listed.json()["data"]}
    assert parents == {BASE: None, f"{BASE}:test": BASE, f"{BASE}:other": BASE, "bare": None}


def test_usage_is_counted_per_adapter(served):
    router, _replicas = served
    answer(router, f"{BASE}:other")
    metrics = httpx.get(f"{router}/metrics", headers=metrics_auth(), timeout=10).text
    assert f'llmgw_router_completion_tokens_total{{model="{BASE}:other"}}' in metrics
