"""The routing table: from the database, from a static file, and why a model is not ready."""

from __future__ import annotations

import pytest

from fleet.models import ReplicaState, ShardState
from fleet.routing_table import routing_snapshot
from protocol.routing import ReplicaEndpoint, RoutingSnapshot
from router.table.routes import (
    RETRY_PLACING,
    RETRY_STARTING,
    RETRY_STUCK,
    RoutingTable,
    StaticFileError,
    load_static,
)
from tests.factories import make_model, make_node, make_profile, make_replica, make_shard


def snapshot(*models) -> RoutingSnapshot:
    return RoutingSnapshot.model_validate({"models": list(models)})


def route(**entry):
    entry.setdefault("name", "gemma")
    return RoutingTable.from_snapshot(snapshot(entry)).routes[entry["name"]]


def test_aliases_and_names_both_find_the_model():
    table = RoutingTable.from_snapshot(
        snapshot({"name": "gemma", "aliases": ["g", "small"], "endpoints": []})
    )
    assert table.by_name["g"].name == table.by_name["gemma"].name == "gemma"


def test_a_models_own_name_wins_over_another_models_alias():
    table = RoutingTable.from_snapshot(
        snapshot({"name": "a", "aliases": ["b"]}, {"name": "b", "aliases": []})
    )
    assert table.by_name["b"].name == "b"


def test_endpoint_carries_the_engine_secret_as_a_bearer_header():
    gemma = route(endpoints=[{"replica": "r1", "url": "http://10.0.0.1:9000/", "secret": "s"}])
    assert gemma.endpoints[0].url == "http://10.0.0.1:9000"
    assert gemma.endpoints[0].authorization == b"Bearer s"


@pytest.mark.parametrize(
    ("entry", "words", "retry_after"),
    [
        ({"wanted": 1, "states": {"starting": 1}}, "1 starting", RETRY_STARTING),
        ({"wanted": 1, "states": {"placing": 1}}, "placement is choosing", RETRY_PLACING),
        (
            {"wanted": 1, "states": {"unplaceable": 1}, "reasons": ["0/2 nodes: no GPU"]},
            "Placement says: 0/2 nodes: no GPU",
            RETRY_STUCK,
        ),
        ({"wanted": 0, "states": {}}, "none wanted", RETRY_STUCK),
        ({"wanted": 2, "states": {}}, "2 wanted, none running yet", RETRY_PLACING),
    ],
    ids=["starting", "placing", "unplaceable", "none-wanted", "wanted-not-placed"],
)
def test_unavailable_says_why_and_when_to_retry(entry, words, retry_after):
    message, retry = route(**entry).unavailable()
    assert words in message
    assert retry == retry_after


def test_a_table_keeps_when_and_from_where_it_was_loaded():
    table = RoutingTable.from_snapshot(snapshot(), loaded_at=1_700_000_000.0, source="saved")
    assert (table.loaded_at, table.source) == (1_700_000_000.0, "saved")
    assert RoutingTable.from_snapshot(snapshot()).source == "database"


def test_leaving_out_unanswering_endpoints_keeps_the_others_and_says_why():
    endpoints = [
        {"replica": "r-up", "url": "http://10.0.0.1:9000"},
        {"replica": "r-down", "url": "http://10.0.0.2:9000"},
    ]
    table = RoutingTable.from_snapshot(
        snapshot({"name": "pair", "aliases": ["p"], "endpoints": endpoints},
                 {"name": "solo", "endpoints": endpoints[1:]}),
        loaded_at=1_700_000_000.0, source="saved",
    )  # fmt: skip
    left = table.leaving_out({"r-down": "cannot connect to http://10.0.0.2:9000: refused"})
    assert (left.loaded_at, left.source) == (table.loaded_at, "saved")
    assert left.by_name["p"].replica_ids() == ["r-up"]
    assert left.by_name["pair"] is left.routes["pair"]
    solo = left.routes["solo"]
    assert solo.endpoints == ()
    message, retry = solo.unavailable()
    assert "serving from its saved routing table" in message
    assert "http://10.0.0.2:9000 (replica r-down) did not answer its health check" in message
    assert "refused" in message
    assert retry == RETRY_STARTING
    assert table.routes["solo"].replica_ids() == ["r-down"]  # the table itself is unchanged


def write(tmp_path, text: str):
    path = tmp_path / "static.yaml"
    path.write_text(text)
    return str(path)


def test_static_file_gives_endpoints_and_keys(tmp_path):
    static, keys = load_static(
        write(
            tmp_path,
            "models:\n- name: gemma\n  aliases: [g]\n  endpoints:\n"
            "  - {url: 'http://127.0.0.1:9001', secret: s1}\n"
            f"keys:\n- {{name: team, sha256: '{'a' * 64}', models: [gemma]}}\n",
        )
    )
    table = RoutingTable.from_snapshot(static)
    assert table.by_name["g"].endpoints[0].authorization == b"Bearer s1"
    assert keys == [{"name": "team", "prefix": "team", "sha256": "a" * 64, "models": ["gemma"]}]


def test_static_file_without_keys_must_say_auth_false(tmp_path):
    text = "models:\n- {name: m, endpoints: [{url: 'http://h:1'}]}\n"
    with pytest.raises(StaticFileError, match="keys: missing; .* set `auth: false`"):
        load_static(write(tmp_path, text))
    assert load_static(write(tmp_path, text + "auth: false\n"))[1] is None


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("models: [{name: m, endpoints: [{url: 'h:1'}]}]\nauth: false", "models.0.endpoints.0.url"),
        ("models: [{name: m, endpoints: []}]\nauth: false", "models.0.endpoints"),
        ("models: [{name: m, endpoint: []}]\nauth: false", "models.0.endpoint"),
        ("keys: [{name: k, sha256: nothex}]", "keys.0.sha256"),
        ("models: [", "not YAML"),
    ],
    ids=["bad-url", "no-endpoints", "misspelt-field", "bad-hash", "not-yaml"],
)
def test_static_file_problems_name_the_file_and_field(tmp_path, text, problem):
    path = write(tmp_path, text)
    with pytest.raises(StaticFileError) as refused:
        load_static(path)
    assert path in str(refused.value)
    assert problem in str(refused.value)


@pytest.mark.django_db
def test_snapshot_routes_ready_replicas_to_rank_zero_with_their_secret():
    model = make_model("gemma", aliases=["g"])
    profile = make_profile(model, replicas=3)
    node = make_node("node01", address="10.0.0.7")
    ready = make_replica(profile, state=ReplicaState.READY, secret="s3cret")
    make_shard(ready, rank=0, node=node, port=9100, state=ShardState.READY)
    make_shard(ready, rank=1, node=make_node("node02", address="10.0.0.8"), port=9200)
    make_replica(profile, state=ReplicaState.STARTING)
    make_replica(profile, state=ReplicaState.UNPLACEABLE, reasons=["0/2 nodes have a GPU"])
    make_replica(profile, state=ReplicaState.STOPPED)

    (entry,) = routing_snapshot().models
    assert entry.name == "gemma"
    assert entry.aliases == ["g"]
    assert entry.wanted == 3
    assert entry.endpoints == [
        ReplicaEndpoint(replica=str(ready.id), url="http://10.0.0.7:9100", secret="s3cret")
    ]
    assert entry.states == {"ready": 1, "starting": 1, "unplaceable": 1}
    assert entry.reasons == ["0/2 nodes have a GPU"]


@pytest.mark.django_db
def test_snapshot_says_when_a_ready_replica_has_no_address():
    replica = make_replica(make_profile(make_model("m")), state=ReplicaState.READY)
    make_shard(replica, rank=0, node=make_node("quiet", address=""), port=9100)
    (entry,) = routing_snapshot().models
    assert entry.endpoints == []
    assert "has no address for rank 0" in entry.reasons[0]


@pytest.mark.django_db
def test_snapshot_keeps_serving_a_model_that_left_the_catalog():
    replica = make_replica(make_profile(make_model("old")), state=ReplicaState.READY)
    make_shard(replica, rank=0, node=make_node("n", address="::1"), port=9100)
    replica.profile.model.delete()
    (entry,) = routing_snapshot().models
    assert entry.name == "old"
    assert entry.wanted == 0
    assert entry.endpoints[0].url == "http://[::1]:9100"
