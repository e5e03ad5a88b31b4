"""The playground page over HTTP: ready chat models only, the routers' address, and a key of
the user's own, kept in their session and reused. The browser's chat is in test_deploy_live."""

from __future__ import annotations

import pytest
from django.test import Client

from catalog.models import ApiKey
from fleet.models import ReplicaState
from tests.factories import make_model, make_profile, make_replica

pytestmark = pytest.mark.django_db


@pytest.fixture
def router_url(settings):
    settings.ROUTER_URL = "http://127.0.0.1:8080/"
    return "http://127.0.0.1:8080"


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_only_models_ready_to_chat_are_offered(reader, router_url):
    make_replica(make_profile(make_model("ready-chat")), state=ReplicaState.READY)
    make_replica(make_profile(make_model("still-starting")), state=ReplicaState.STARTING)
    embeddings = make_profile(make_model("vectors", source="/m/v.gguf"), serves=["embeddings"])
    make_replica(embeddings, state=ReplicaState.READY)
    html = signed_in(reader).get("/playground/").content.decode()
    assert '<option value="ready-chat">' in html
    assert "still-starting" not in html and "vectors" not in html
    assert f'data-router-url="{router_url}"' in html
    assert 'data-key-url="/playground/key/"' in html
    assert '"playground: rita"' in html


def test_without_the_routers_address_the_page_says_what_to_set(reader, settings):
    settings.ROUTER_URL = ""
    make_replica(make_profile(make_model("ready-chat")), state=ReplicaState.READY)
    html = signed_in(reader).get("/playground/").content.decode()
    assert "LLMGW_ROUTER_URL" in html and 'id="playground"' not in html


def test_a_user_gets_a_key_of_their_own_and_the_same_one_again(reader, router_url):
    client = signed_in(reader)
    first = client.post("/playground/key/").json()
    assert first["key"].startswith(first["prefix"])
    row = ApiKey.objects.get(prefix=first["prefix"])
    assert row.name == "playground: rita" and row.expires_at is not None
    assert client.post("/playground/key/").json() == first
    # Another session of the same user holds no key yet: it gets one of its own.
    other = signed_in(reader).post("/playground/key/").json()
    assert other["prefix"] != first["prefix"]
    assert ApiKey.objects.filter(name="playground: rita").count() == 2


def test_keys_are_for_signed_in_users_and_posts_only(reader):
    response = Client().post("/playground/key/")
    assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")
    assert signed_in(reader).get("/playground/key/").status_code == 405
    assert not ApiKey.objects.exists()
