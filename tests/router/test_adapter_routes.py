"""An adapter's route in the router (issue 44), without processes: the body each replica is
sent (llama.cpp: every adapter it loaded, by its own ids), the prefix key that keeps an
adapter's cache apart from its base's, and the demand routers report for autoscaling."""

from __future__ import annotations

import json

from protocol.routing import ReplicaEndpoint, RoutableModel, RoutingSnapshot
from router.balance.balancer import Balancer
from router.balance.inflight import inflight_report
from router.balance.prefix import affinity_for
from router.config import RouterConfig
from router.table.adapters import body_for
from router.table.routes import RoutingTable

LLAMA = ReplicaEndpoint(replica="r1", url="http://10.0.0.1:9001", engine="llama.cpp",
                        adapters=["sql", "chat"])  # fmt: skip
VLLM = ReplicaEndpoint(replica="r2", url="http://10.0.0.2:9001", engine="vllm", max_loras=4)
BARE = ReplicaEndpoint(replica="r3", url="http://10.0.0.3:9001", engine="llama.cpp")


def table() -> RoutingTable:
    snapshot = RoutingSnapshot(
        models=[
            RoutableModel(name="gemma", endpoints=[LLAMA, VLLM, BARE], routing="prefix"),
            RoutableModel(name="gemma:chat", parent="gemma", adapter="chat", scale=0.5,
                          endpoints=[LLAMA, VLLM], routing="prefix"),
        ]
    )  # fmt: skip
    return RoutingTable.from_snapshot(snapshot)


def sent(model: str, replica: str) -> dict:
    routes = table().routes
    route = routes[model]
    endpoint = next(e for e in routes["gemma"].endpoints if e.replica == replica)
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}]})
    return json.loads(body_for(body.encode(), route, endpoint))


def test_llama_cpp_is_told_every_adapter_it_loaded_by_its_own_ids():
    asked = sent("gemma:chat", "r1")
    assert asked["lora"] == [{"id": 0, "scale": 0.0}, {"id": 1, "scale": 0.5}]
    assert asked["model"] == "gemma"  # llama.cpp serves adapters under its base's name


def test_the_base_on_a_replica_with_adapters_is_sent_every_adapter_at_zero():
    # llama.cpp applies a loaded adapter a request does not name (DESIGN.md, "Pitfalls").
    assert sent("gemma", "r1")["lora"] == [{"id": 0, "scale": 0.0}, {"id": 1, "scale": 0.0}]


def test_vllm_and_a_replica_without_adapters_get_the_body_as_it_came():
    asked = sent("gemma:chat", "r2")
    assert (asked["model"], "lora" in asked) == ("gemma:chat", False)
    assert "lora" not in sent("gemma", "r3")


def test_an_adapter_and_its_base_key_the_same_prompt_apart():
    routes, config = table().routes, RouterConfig.from_env()
    prompt = {"messages": [{"role": "system", "content": "You are terse. " * 40},
                           {"role": "user", "content": "hi"}]}  # fmt: skip
    base = affinity_for(routes["gemma"], prompt, "/v1/chat/completions", None, config)
    adapter = affinity_for(routes["gemma:chat"], prompt, "/v1/chat/completions", None, config)
    assert base and adapter and base != adapter


def test_what_waits_for_an_adapter_is_reported_as_demand_for_its_base():
    balancer = Balancer()
    report = inflight_report(table(), balancer, 0.0, {"gemma:chat": 3, "gemma": 1})
    assert report["models"] == {"gemma": {"inflight": 0, "queued": 4}}
