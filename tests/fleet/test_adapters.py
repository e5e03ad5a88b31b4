"""LoRA adapters in the fleet (issue 44): a replica starts with its model's adapters and
records them, an adapter added later restarts nothing, and the routing snapshot serves each
adapter as a model of its own on the replicas that have it (or, on vLLM, can load it)."""

from __future__ import annotations

import json
import time

import pytest
from django.core.management import CommandError
from django.test import Client

from audit.models import Event
from audit.redis import redis_client
from catalog.actions.entries import apply_catalog
from catalog.models import Profile
from fleet.models import Node, Replica, Shard
from fleet.routing_table import routing_snapshot
from protocol.routing import traffic_key
from protocol.shard import ShardSpec
from tests.ctl import ctl
from tests.factories import SETUP
from tests.fleet.cluster import connect, run
from tests.fleet.queues import queued_commands
from tests.router.harness import Harness

pytestmark = pytest.mark.django_db


def catalog(*adapters: str, engine: str = "llama.cpp", extra: str = "") -> str:
    listed = "".join(
        f"\n      - name: {name}\n        source: /loras/{name}.gguf" for name in adapters
    )
    return f"""
models:
  - name: gemma
    source: /models/gemma.gguf
    profiles:
      - name: cpu
        engine: {engine}
        memory: 1GiB{extra}
    adapters: {"[]" if not adapters else listed}
"""


def make_ready(replica: Replica) -> None:
    """The replica's engines answered, as the agent reports it."""
    Replica.objects.filter(id=replica.id).update(state="ready")
    Shard.objects.filter(replica=replica).update(state="ready")
    Node.objects.filter(shards__replica=replica).update(address="10.0.0.1")


def served(name: str):
    return next(model for model in routing_snapshot().models if model.name == name)


def test_a_replica_starts_with_its_models_adapters_and_one_added_later_restarts_nothing(
    node_ids, django_capture_on_commit_callbacks
):
    connect(node_ids[0])
    apply_catalog(catalog("sql", "chat"), actor=SETUP)
    run(django_capture_on_commit_callbacks, epoch=3)
    replica = Replica.objects.get()
    [(_task, args)] = queued_commands(node_ids[0])
    spec = ShardSpec.model_validate_json(args[0])
    assert [(a.name, a.source) for a in spec.adapters] == [
        ("sql", "/loras/sql.gguf"), ("chat", "/loras/chat.gguf"),
    ]  # fmt: skip
    assert replica.adapters == ["sql", "chat"]  # in llama.cpp's id order

    apply_catalog(catalog("sql", "chat", "late"), actor=SETUP)
    assert not run(django_capture_on_commit_callbacks).did_anything()
    assert len(queued_commands(node_ids[0])) == 1  # no stop, no second start
    assert Replica.objects.get().fingerprint == replica.fingerprint

    make_ready(replica)
    [endpoint] = served("gemma").endpoints
    assert endpoint.adapters == ["sql", "chat"]
    assert served("gemma:sql").endpoints == [endpoint]
    assert served("gemma:sql").parent == "gemma"
    # llama.cpp loads adapters only at start: the late one waits for a restart, and says so.
    late = served("gemma:late")
    assert late.endpoints == [] and late.wanted == 1
    assert any("started before adapter late was added" in reason for reason in late.reasons)


def test_a_vllm_replica_serves_an_adapter_added_later_by_loading_it(
    node_ids, django_capture_on_commit_callbacks
):
    connect(node_ids[0], engines=("vllm",))
    lora_on = "\n        max_loras: 2"
    apply_catalog(catalog(engine="vllm", extra=lora_on), actor=SETUP)
    run(django_capture_on_commit_callbacks)
    replica = Replica.objects.get()
    assert replica.adapters == []
    apply_catalog(catalog("sql", engine="vllm", extra=lora_on), actor=SETUP)
    make_ready(replica)
    [endpoint] = served("gemma:sql").endpoints
    assert (endpoint.replica, endpoint.max_loras) == (str(replica.id), 2)
    assert served("gemma:sql").source == "/loras/sql.gguf"


def test_llmgw_ctl_adapters_lists_where_each_is_loaded_and_its_traffic(
    node_ids, django_capture_on_commit_callbacks
):
    connect(node_ids[0])
    apply_catalog(catalog("sql"), actor=SETUP)
    run(django_capture_on_commit_callbacks)
    replica = Replica.objects.get()
    apply_catalog(catalog("sql", "late"), actor=SETUP)
    make_ready(replica)
    client, traffic = redis_client(), traffic_key("gemma:sql", time.time())
    client.delete(*client.scan_iter(traffic.rsplit(":", 1)[0] + ":*"), traffic)
    client.hset(traffic, "requests", 3)
    client.expire(traffic, 60)  # the routers' counts expire; so does this one

    rows = {row["adapter"]: row for row in json.loads(ctl("adapters", "--json"))}
    assert rows["gemma:sql"]["loaded"] == [str(replica.id)]
    assert rows["gemma:sql"]["requests_last_hour"] == 3
    assert (rows["gemma:late"]["loaded"], rows["gemma:late"]["on_demand"]) == ([], [])
    table = ctl("adapters")
    assert "gemma:sql" in table and str(replica.id)[:8] in table


def test_the_model_page_lists_each_adapter_and_where_it_is_loaded(
    node_ids, django_capture_on_commit_callbacks, reader
):
    connect(node_ids[0])
    apply_catalog(catalog("sql"), actor=SETUP)
    run(django_capture_on_commit_callbacks)
    replica = Replica.objects.get()
    make_ready(replica)
    client = Client()
    client.force_login(reader)
    html = client.get("/models/gemma/").content.decode()
    assert '<tr data-adapter="gemma:sql">' in html
    assert f"<code>{str(replica.id)[:8]}</code>" in html


@pytest.mark.process
def test_llmgw_ctl_loads_and_unloads_an_adapter_by_hand_on_vllm_only(
    node_ids, django_capture_on_commit_callbacks, tmp_path
):
    connect(node_ids[0], engines=("vllm",))
    lora_on = "\n        max_loras: 2"
    apply_catalog(catalog("sql", engine="vllm", extra=lora_on), actor=SETUP)
    run(django_capture_on_commit_callbacks)
    replica = Replica.objects.get()
    harness = Harness(tmp_path)
    try:
        engine = harness.engine("vllm", replica.secret)  # it wants the replica's secret
        make_ready(replica)
        Node.objects.update(address="127.0.0.1")
        Shard.objects.update(port=int(engine.url.rsplit(":", 1)[1]))
        said = ctl("adapters", "load", "gemma:sql", str(replica.id)[:8])
        assert "the engine answered 200" in said
        assert engine.state()["loras"] == {"gemma:sql": "/loras/sql.gguf"}
        ctl("adapters", "unload", "gemma:sql", str(replica.id))
        assert engine.state()["loras"] == {}
        assert (
            Event.objects.filter(subject=str(replica.id), reason__contains="by hand").count() == 2
        )
    finally:
        harness.cleanup()
    Profile.objects.update(engine="llama.cpp", max_loras=0)
    Replica.objects.update(engine="llama.cpp")
    with pytest.raises(CommandError, match="loads adapters only at its start"):
        ctl("adapters", "load", "gemma:sql", str(replica.id)[:8])
    with pytest.raises(CommandError, match="no adapter is named 'gemma:nope'"):
        ctl("adapters", "load", "gemma:nope", str(replica.id)[:8])
