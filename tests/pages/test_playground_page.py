"""The playground page over HTTP: for its group only, ready chat models only, the routers'
address, and a key of the user's own, one live at a time, of which the session keeps only a
reference. The browser's chat is in test_deploy_live."""

from __future__ import annotations

import pytest
from django.test import Client

from catalog.models import ApiKey
from fleet.models import ReplicaState
from tests.factories import make_model, make_profile, make_replica, make_user

pytestmark = pytest.mark.django_db


@pytest.fixture
def router_url(settings):
    settings.ROUTER_URL = "http://127.0.0.1:8080/"
    return "http://127.0.0.1:8080"


@pytest.fixture
def player(db):
    """A reader the operator let into the playground."""
    return make_user("pia", playground=True)


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_only_models_ready_to_chat_are_offered(player, router_url):
    make_replica(make_profile(make_model("ready-chat")), state=ReplicaState.READY)
    make_replica(make_profile(make_model("still-starting")), state=ReplicaState.STARTING)
    embeddings = make_profile(make_model("vectors", source="/m/v.gguf"), serves=["embeddings"])
    make_replica(embeddings, state=ReplicaState.READY)
    html = signed_in(player).get("/playground/").content.decode()
    assert '<option value="ready-chat">' in html
    assert "still-starting" not in html and "vectors" not in html
    assert f'data-router-url="{router_url}"' in html
    assert 'data-key-url="/playground/key/"' in html
    assert '"playground: pia"' in html


def test_without_the_routers_address_the_page_says_what_to_set(player, settings):
    settings.ROUTER_URL = ""
    make_replica(make_profile(make_model("ready-chat")), state=ReplicaState.READY)
    html = signed_in(player).get("/playground/").content.decode()
    assert "LLMGW_ROUTER_URL" in html and 'id="playground"' not in html


def test_a_user_gets_a_key_of_their_own_and_the_session_only_its_reference(player, router_url):
    make_profile(make_model("ready-chat"))
    client = signed_in(player)
    first = client.post("/playground/key/").json()
    assert first["key"].startswith(first["prefix"])
    row = ApiKey.objects.get(prefix=first["prefix"])
    assert row.name == "playground: pia" and row.expires_at is not None
    assert row.priority == "low" and row.tokens_per_day and row.allowed_models == ["ready-chat"]
    remembered = client.session["llmgw_playground_key"]
    assert remembered["prefix"] == first["prefix"] and first["key"] not in str(remembered)
    # Another session (or a cleared one) asks again: a new key, and the first is revoked.
    other = signed_in(player).post("/playground/key/").json()
    assert other["prefix"] != first["prefix"]
    live = ApiKey.objects.filter(name="playground: pia", revoked_at__isnull=True)
    assert [k.prefix for k in live] == [other["prefix"]]


def test_a_reader_outside_the_group_is_refused_naming_it(reader, router_url):
    make_profile(make_model("ready-chat"))
    client = signed_in(reader)
    for response in (client.get("/playground/"), client.post("/playground/key/")):
        assert response.status_code == 403
        assert "'playground' group" in response.content.decode()
    assert not ApiKey.objects.exists()


def test_keys_are_for_signed_in_users_and_posts_only(reader):
    response = Client().post("/playground/key/")
    assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")
    assert signed_in(make_user("pia", playground=True)).get("/playground/key/").status_code == 405
    assert not ApiKey.objects.exists()
