"""API keys: the verbs, `llmgw_ctl keys`, and the notifications routers reload on."""

from __future__ import annotations

import time

import pytest
import redis
from django.conf import settings
from django.core.management import CommandError

from catalog.actions.api_keys import create_key, revoke_key
from catalog.keys import ApiKeyRefused, active_keys, hash_key
from catalog.models import ApiKey
from core.redis_clients import channel_on
from fleet.models import Replica, ReplicaState
from fleet.transitions import transition
from protocol.routing import ROUTING_CHANNEL
from tests.ctl import ctl
from tests.factories import SETUP, make_model, make_replica

pytestmark = pytest.mark.django_db


@pytest.fixture
def notifications():
    """Messages on the routing channel, read from the real Redis."""
    client = redis.Redis.from_url(settings.REDIS_URL)
    pubsub = client.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(channel_on(client, ROUTING_CHANNEL))

    def received(expected: int = 1, patience: float = 10.0) -> list[bytes]:
        messages: list[bytes] = []
        deadline = time.monotonic() + patience
        while len(messages) < expected and time.monotonic() < deadline:
            message = pubsub.get_message(timeout=0.2)
            if message:
                messages.append(message["data"])
        return messages

    yield received
    pubsub.close()
    client.close()


def test_a_key_is_stored_only_as_its_hash_and_prefix():
    make_model("gemma")
    row, key = create_key("team-a", ["gemma"], actor=SETUP)
    assert key.startswith("llmgw-") and len(key) > 40
    row.refresh_from_db()
    assert row.hashed_key == hash_key(key) != key
    assert key.startswith(row.prefix)
    assert key not in str(ApiKey.objects.values_list())
    assert active_keys() == [
        {"name": "team-a", "prefix": row.prefix, "sha256": hash_key(key), "models": ["gemma"],
         "limits": {"concurrency": 64}, "expires_at": None, "priority": "normal",
         "user": None, "team": "default", "team_limits": {}, "capped": [],
         "team_models": None}
    ]  # fmt: skip


def test_a_key_for_a_model_the_catalog_lacks_is_refused():
    make_model("gemma", aliases=["g"])
    create_key("alias-is-fine", ["g"], actor=SETUP)
    with pytest.raises(ApiKeyRefused, match="unknown model.*gema; the catalog has: g, gemma"):
        create_key("typo", ["gema"], actor=SETUP)


def test_revoked_keys_leave_what_routers_load():
    row, key = create_key("team-b", actor=SETUP)
    revoke_key(row.prefix, actor=SETUP)
    assert active_keys() == []
    row.refresh_from_db()
    assert row.revoked_at is not None
    assert (
        revoke_key(key, actor=SETUP).revoked_at == row.revoked_at
    )  # the whole key works too; once


def test_creating_and_revoking_a_key_tell_the_routers(
    django_capture_on_commit_callbacks, notifications
):
    with django_capture_on_commit_callbacks(execute=True):
        row, _key = create_key("team-c", actor=SETUP)
    assert notifications() == [b"keys"]
    with django_capture_on_commit_callbacks(execute=True):
        revoke_key(row.prefix, actor=SETUP)
    assert notifications() == [b"keys"]


def test_a_replica_entering_or_leaving_ready_tells_the_routers(
    django_capture_on_commit_callbacks, notifications
):
    replica = make_replica(state=ReplicaState.STARTING)
    with django_capture_on_commit_callbacks(execute=True):
        transition(Replica, replica.pk, ReplicaState.READY, "rank 0 answers", actor=SETUP)
    assert notifications() == [b"replicas"]
    with django_capture_on_commit_callbacks(execute=True):
        transition(Replica, replica.pk, ReplicaState.STOPPING, "scaled down", actor=SETUP)
    assert notifications() == [b"replicas"]


def test_other_replica_transitions_stay_quiet(notifications, django_capture_on_commit_callbacks):
    replica = make_replica(state=ReplicaState.PLACING)
    with django_capture_on_commit_callbacks(execute=True):
        transition(Replica, replica.pk, ReplicaState.STARTING, "placed", actor=SETUP)
    assert notifications(patience=1.0) == []


def test_ctl_create_prints_the_key_once_and_list_shows_only_the_prefix():
    make_model("gemma")
    output = ctl("keys", "create", "ci-bot", "--models", "gemma")
    key = output.splitlines()[0]
    assert ApiKey.objects.get().hashed_key == hash_key(key)
    assert "it is not shown again" in output
    listing = ctl("keys", "list")
    header = listing.splitlines()[0].split()
    assert header == ["NAME", "PREFIX", "TEAM", "MODELS", "LIMITS", "CREATED", "REVOKED"]
    assert key[:14] in listing and key not in listing
    assert "gemma" in listing


def test_ctl_revoke_by_prefix_and_unknown_prefix_says_how_to_find_one():
    key = ctl("keys", "create", "temp").splitlines()[0]
    assert "revoked key" in ctl("keys", "revoke", key[:14])
    assert ApiKey.objects.get().revoked_at is not None
    with pytest.raises(CommandError, match="no key with prefix 'llmgw-nothing'.*keys list"):
        ctl("keys", "revoke", "llmgw-nothing")


def test_ctl_create_refuses_unknown_models_with_exit_status():
    with pytest.raises(CommandError, match="unknown model"):
        ctl("keys", "create", "x", "--models", "nope")


def test_an_operator_creates_lists_and_revokes_keys_through_the_api(api_client, operator):
    make_model("gemma")
    api_client.force_authenticate(operator)
    created = api_client.post(
        "/api/v1/keys/", {"name": "svc", "models": ["gemma"]}, format="json"
    ).json()
    assert created["key"].startswith(created["prefix"])
    assert created["models"] == ["gemma"]
    listed = api_client.get("/api/v1/keys/").json()["results"]
    assert [k["prefix"] for k in listed] == [created["prefix"]]
    assert "key" not in listed[0] and "hashed_key" not in listed[0]
    revoked = api_client.post(f"/api/v1/keys/{created['id']}/revoke/").json()
    assert revoked["revoked_at"] is not None
    assert active_keys() == []


def test_the_api_refuses_keys_for_unknown_models(api_client, operator):
    api_client.force_authenticate(operator)
    response = api_client.post("/api/v1/keys/", {"name": "svc", "models": ["nope"]}, format="json")
    assert response.status_code == 400
    assert "unknown model" in str(response.json())


def test_readers_cannot_see_or_make_keys(api_client, reader):
    api_client.force_authenticate(reader)
    assert api_client.get("/api/v1/keys/").status_code == 403
    assert api_client.post("/api/v1/keys/", {"name": "x"}, format="json").status_code == 403
