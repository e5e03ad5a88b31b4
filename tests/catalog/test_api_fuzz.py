"""Hostile REST API bodies from a signed-in operator, through Django's whole stack.

Every one is created, or refused with a 4xx naming the field and leaving every row as
it was; none is a 500 (the test client raises whatever a view fails to handle).
"""

from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from rest_framework.test import APIClient

from audit.models import Event
from catalog.models import ApiKey, Engine, Fabric, Model, Pool, Profile
from tests.factories import make_profile
from tests.fuzz.hostile import DEEP, deep_json, dumps, mutated, raw_frames

pytestmark = pytest.mark.django_db

SHA = "0" * 64
BUILD = {"name": "cpu", "url": "https://example.invalid/llama.tar.gz", "sha256": SHA}
VALID = {
    "models": [{"name": "gemma-2", "source": "/m/g.gguf", "aliases": ["g2"], "sha256": SHA}],
    "profiles": [{"model": "gemma", "name": "big", "engine": "llama.cpp", "memory": "1GiB",
                  "replicas": 1, "args": ["--threads", "1"], "env": {"A": "1"},
                  "rollout": {"surge": 1, "unavailable": 0}, "drain_timeout": "30s"}],
    "engines": [{"name": "llama.cpp", "version": "b6000", "builds": [BUILD]}],
    "pools": [{"name": "gpu", "description": "the big ones"}],
    "fabrics": [{"name": "ib0", "description": "rack 1"}],
    "keys": [{"name": "svc", "models": ["gemma"]}],
}  # fmt: skip
KEYS = (
    "name", "model", "source", "engine", "replicas", "memory", "builds", "models", "nodes",
    "gpus_per_rank", "tensor_parallel", "rollout", "startup_timeout", "launch_mode",
)  # fmt: skip

writes = st.sampled_from(sorted(VALID)).flatmap(
    lambda kind: st.tuples(
        st.just(kind),
        st.sampled_from(["post", "patch", "put"] if kind in ("models", "profiles") else ["post"]),
        st.one_of(mutated(VALID[kind], KEYS).map(dumps), raw_frames),
    )
)


def rows() -> tuple:
    return tuple(
        sorted(map(str, kind.objects.values_list()))
        for kind in (Model, Profile, Engine, Pool, Fabric, ApiKey, Event)
    )


@pytest.fixture
def operator_client(operator):
    client = APIClient()
    client.force_authenticate(operator)
    return client


@pytest.fixture
def profile(db):
    return make_profile()  # model "gemma", profile "cpu"


BIG = "<over DATA_UPLOAD_MAX_MEMORY_SIZE>"  # by name, so a failure's report does not print it


@given(write=writes)
@example(write=("models", "post", BIG))
@example(write=("models", "post", deep_json(DEEP)))
@example(write=("profiles", "patch", '{"args": ' + "[" * DEEP + "]" * DEEP + "}"))
def test_hostile_api_writes_are_refused_with_the_field_named(
    operator_client, profile, write, settings
):
    kind, method, body = write
    if body == BIG:
        body = dumps({"name": "big", "source": "x" * (settings.DATA_UPLOAD_MAX_MEMORY_SIZE + 1)})
    url = f"/api/v1/{kind}/"
    if method != "post":
        target = profile if kind == "profiles" else profile.model
        url += f"{target.id}/"
    before = rows()
    response = getattr(operator_client, method)(
        url, data=body.encode(errors="surrogatepass"), content_type="application/json"
    )
    assert response.status_code < 500
    if response.status_code >= 400:
        assert response.json(), "a refusal says why"
        assert rows() == before, f"refused {method} {url} changed a row"
    for created in Model.objects.exclude(id=profile.model_id):
        created.delete()  # room for the next example to create its own


def test_an_api_body_over_the_size_limit_is_refused_before_parsing(operator_client, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1024
    body = dumps({"name": "big", "source": "/m/" + "x" * 2048})
    response = operator_client.post("/api/v1/models/", data=body, content_type="application/json")
    assert response.status_code == 413
    assert "1024 bytes" in response.json()["detail"]
    assert not Model.objects.exists()
