"""What the routing snapshot says each model and replica serves, and which chat APIs each
replica's engine answers itself; and the shard spec that tells the engine what to serve."""

from __future__ import annotations

import pytest

from fleet.planning.shard_specs import MeetingPoints, shard_spec
from fleet.routing_table import routing_snapshot
from protocol.routing import ReplicaEndpoint, RoutableModel, RoutingSnapshot
from tests.factories import make_model, make_node, make_profile, make_replica, make_shard

pytestmark = pytest.mark.django_db


def ready(profile, port: int, engine: str = "llama.cpp", version: str = "b6000"):
    node = make_node(f"node{port}", address="10.0.0.1")
    replica = make_replica(profile, state="ready", engine=engine, engine_version=version)
    make_shard(replica, node=node, port=port, state="ready")
    return replica


def test_a_model_serves_what_its_profiles_serve_and_each_endpoint_what_its_own_does():
    model = make_model("minilm")
    chat = make_profile(model, "chat")
    embed = make_profile(model, "embed", serves=["embeddings"])
    chatting, embedding = ready(chat, 20000), ready(embed, 20002)

    [entry] = routing_snapshot().models
    assert entry.serves == ["chat", "embeddings"]
    endpoints = {e.replica: e for e in entry.endpoints}
    assert endpoints[str(chatting.id)].serves == ["chat"]
    assert endpoints[str(embedding.id)].serves == ["embeddings"]


def test_an_endpoint_says_which_chat_apis_its_engine_answers_itself():
    profile = make_profile(make_model("qwen"), "gpu", engine="vllm")
    old, new = ready(profile, 20000, "vllm", "0.9.2"), ready(profile, 20002, "vllm", "0.11.0")
    llama = ready(make_profile(make_model("gemma")), 20004)

    endpoints = {e.replica: e for m in routing_snapshot().models for e in m.endpoints}
    assert endpoints[str(old.id)].native == []  # the router translates both
    assert endpoints[str(new.id)].native == ["messages", "responses"]
    assert endpoints[str(llama.id)].native == ["messages", "responses"]


def test_a_replica_whose_profile_left_the_catalog_serves_chat():
    profile = make_profile(make_model("minilm"), "embed", serves=["embeddings"])
    replica = ready(profile, 20000)
    profile.delete()

    [entry] = routing_snapshot().models
    [endpoint] = entry.endpoints
    assert endpoint.replica == str(replica.id)
    assert endpoint.serves == ["chat"]


def test_a_saved_snapshot_from_before_serves_still_loads_as_chat():
    saved = {
        "models": [
            {"name": "gemma", "endpoints": [{"replica": "r1", "url": "http://10.0.0.1:20000"}]}
        ]
    }
    [model] = RoutingSnapshot.model_validate(saved).models
    assert model.serves == ["chat"]
    assert (model.endpoints[0].serves, model.endpoints[0].native) == (["chat"], [])
    assert RoutableModel(name="x").serves == ReplicaEndpoint(replica="r", url="u").serves


def test_the_shard_spec_carries_what_the_profile_serves():
    node = make_node("node01", address="10.0.0.1")
    embed = make_profile(make_model("minilm"), serves=["embeddings"], args=["--pooling", "mean"])
    replica = make_replica(embed)
    spec = shard_spec(replica, make_shard(replica, node=node, port=20000), node, 1,
                      MeetingPoints(), None, epoch=0)  # fmt: skip
    assert (spec.serves, spec.args) == (["embeddings"], ["--pooling", "mean"])

    chat = make_profile(make_model("gemma"))
    replica = make_replica(chat)
    spec = shard_spec(replica, make_shard(replica, node=node, port=20002), node, 1,
                      MeetingPoints(), None, epoch=0)  # fmt: skip
    assert spec.serves == []
