"""The REST API: token or session auth, operators write, validation reads like apply's."""

from __future__ import annotations

import pytest

from audit.models import Event
from catalog.models import Model
from tests.factories import api_token_of, make_model, make_node, make_profile

pytestmark = pytest.mark.django_db

READ_ENDPOINTS = [
    "/api/v1/models/",
    "/api/v1/profiles/",
    "/api/v1/engines/",
    "/api/v1/pools/",
    "/api/v1/fabrics/",
    "/api/v1/nodes/",
    "/api/v1/replicas/",
    "/api/v1/shards/",
    "/api/v1/events/",
]


@pytest.mark.parametrize("url", READ_ENDPOINTS)
def test_anonymous_requests_are_refused(api_client, url):
    response = api_client.get(url)
    assert response.status_code == 401
    assert "credentials" in response.json()["detail"]


@pytest.mark.parametrize("url", READ_ENDPOINTS)
def test_a_token_reads_every_endpoint(api_client, reader, url):
    api_client.credentials(HTTP_AUTHORIZATION=f"Token {api_token_of(reader)}")
    assert api_client.get(url).status_code == 200


def test_a_bad_token_is_refused(api_client):
    api_client.credentials(HTTP_AUTHORIZATION="Token not-a-token")
    response = api_client.get("/api/v1/models/")
    assert response.status_code == 401
    assert "Unknown token" in response.json()["detail"]


def test_a_reader_cannot_change_the_catalog(api_client, reader):
    api_client.force_authenticate(reader)
    response = api_client.post("/api/v1/models/", {"name": "x", "source": "/m/x.gguf"})
    assert response.status_code == 403
    assert "operator role" in response.json()["detail"]
    assert not Model.objects.exists()


def test_an_operator_creates_a_model_and_profile(api_client, operator):
    api_client.force_authenticate(operator)
    response = api_client.post(
        "/api/v1/models/", {"name": "gemma", "source": "/m/gemma.gguf"}, format="json"
    )
    assert response.status_code == 201, response.json()
    response = api_client.post(
        "/api/v1/profiles/",
        {"model": "gemma", "name": "cpu", "engine": "llama.cpp", "memory": "1GiB"},
        format="json",
    )
    assert response.status_code == 201, response.json()
    assert response.json()["memory"] == 1024**3
    assert len(response.json()["fingerprint"]) == 16


def test_every_api_write_is_an_event_naming_the_operator_and_tells_routers(
    api_client, operator, django_capture_on_commit_callbacks
):
    api_client.force_authenticate(operator)
    with django_capture_on_commit_callbacks() as callbacks:
        created = api_client.post(
            "/api/v1/models/", {"name": "gemma", "source": "/m/a.gguf"}, format="json"
        )
        model_id = created.json()["id"]
        api_client.patch(f"/api/v1/models/{model_id}/", {"aliases": ["g"]}, format="json")
        api_client.delete(f"/api/v1/models/{model_id}/")
    events = list(Event.objects.filter(subject="model/gemma").order_by("id"))
    assert [e.reason for e in events] == [
        "created model gemma", "updated model gemma: aliases", "deleted model gemma",
    ]  # fmt: skip
    assert {e.actor for e in events} == {operator}
    # Each write also sends its page and router notices once it commits.
    assert len(callbacks) == 6


@pytest.mark.parametrize(
    ("payload", "field", "message"),
    [
        ({"engine": "tgi"}, "engine", "unknown engine 'tgi'; llmgw runs llama.cpp, vllm, sglang"),
        ({"memory": "lots"}, "memory", "'lots' is not a size; write it like 1GiB, 300MiB or 2GB"),
        (
            {"gpus_per_rank": 2, "tensor_parallel": 3},
            "non_field_errors",
            "tensor_parallel 3 does not divide gpus_per_rank 2; use a tensor_parallel that "
            "divides it",
        ),
    ],
    ids=["engine", "size", "tensor-parallel"],
)
def test_api_validation_names_the_field_like_apply(api_client, operator, payload, field, message):
    make_model(name="gemma")
    api_client.force_authenticate(operator)
    body = {"model": "gemma", "name": "cpu", "engine": "llama.cpp", **payload}
    response = api_client.post("/api/v1/profiles/", body, format="json")
    assert response.status_code == 400
    assert response.json()[field] == [message]


def test_an_operator_updates_a_profile_partially(api_client, operator):
    profile = make_profile(replicas=1)
    api_client.force_authenticate(operator)
    response = api_client.patch(f"/api/v1/profiles/{profile.id}/", {"replicas": 3}, format="json")
    assert response.status_code == 200, response.json()
    profile.refresh_from_db()
    assert profile.replicas == 3


def test_fleet_endpoints_are_read_only_even_for_operators(api_client, operator):
    make_node("node01")
    api_client.force_authenticate(operator)
    assert api_client.delete("/api/v1/nodes/node01/").status_code == 405


def test_openapi_schema_is_served(client):
    response = client.get("/api/schema/")
    assert response.status_code == 200
    assert b"/api/v1/models/" in response.content
