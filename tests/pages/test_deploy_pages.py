"""The new-model and edit-profile pages and deleting a model, over HTTP: operators only, each
problem shown on its field, a plan that changes nothing, and changes made by the verbs with
the operator named. The browser's run of the same is in test_deploy_live."""

from __future__ import annotations

import re
from html import unescape

import pytest
from django.test import Client

from audit.filters import ACCOUNT_KINDS
from audit.models import Event
from catalog.actions.entries import apply_catalog
from catalog.models import Model, Profile
from fleet.models import ReplicaState
from fleet.pages.deploy_views import REPLANNED, RESTARTS
from fleet.planning.deploy import entry_digest
from tests.factories import SETUP, make_replica
from tests.pages.rows import heartbeating_node

pytestmark = pytest.mark.django_db

GEMMA = """
engines:
  - name: llama.cpp
    version: b5000
models:
  - name: gemma
    source: /models/gemma.gguf
    profiles:
      - name: cpu
        engine: llama.cpp
        memory: 1GiB
        context: 2048
        args: ["--threads", "2"]
"""


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def form(**fields) -> dict[str, str]:
    """What the new-model form posts, its defaults untouched but for ``fields``."""
    data = {
        "name": "smollm-copy",
        "source": "/models/smollm.gguf",
        "profile": "default",
        "engine": "llama.cpp",
        "launch_mode": "native",
        "strategy": "pack",
        "routing": "least_outstanding",
        "replicas": "1",
        "memory": "512MiB",
        "action": "plan",
    }
    data.update(fields)
    return data


def field(html: str, name: str) -> str:
    """One field's block on the form: label, input, help and errors."""
    found = re.search(rf'<div class="field[^"]*" data-field="{name}">(.*?)</div>', html, re.S)
    assert found, f"no field {name} on the page"
    return unescape(found.group(1))


def test_the_pages_ask_who_it_is_and_refuse_readers(reader):
    profile = Profile.objects.create(
        model=Model.objects.create(name="gemma", source="/m.gguf"), name="cpu", engine="llama.cpp"
    )
    anonymous = Client()
    for url in ("/deploy/", f"/profiles/{profile.id}/edit/", "/playground/"):
        assert anonymous.get(url)["Location"].startswith("/accounts/login/?next="), url
    client = signed_in(reader)
    for url in ("/deploy/", f"/profiles/{profile.id}/edit/"):
        for response in (client.get(url), client.post(url, form(action="deploy"))):
            assert response.status_code == 403, url
            assert "operator role" in response.content.decode()
    assert client.post(f"/catalog/models/{profile.model.id}/delete/").status_code == 403
    assert list(Model.objects.values_list("name", flat=True)) == ["gemma"]
    assert Profile.objects.get().context == 0
    assert 'href="/deploy/"' not in client.get("/").content.decode()


def test_the_form_starts_from_the_catalogs_defaults(operator):
    html = signed_in(operator).get("/deploy/").content.decode()
    assert 'value="1"' in field(html, "replicas")
    assert 'value="10m"' in field(html, "startup_timeout")
    assert 'value="30s"' in field(html, "drain_timeout")
    assert 'value="1"' in field(html, "rollout_surge")
    assert '<option value="llama.cpp" selected>' in field(html, "engine")
    assert "empty: the model file's estimate" in field(html, "memory")
    assert 'href="/deploy/"' in signed_in(operator).get("/").content.decode()


def test_each_problem_is_shown_on_its_field_and_nothing_is_written(operator):
    client = signed_in(operator)
    html = client.post(
        "/deploy/", form(name="", context="-1", memory="lots", env="NOEQUALS", source="ftp://x")
    ).content.decode()
    assert "this is required" in field(html, "name")
    assert "greater than or equal to 0" in field(html, "context")
    assert "'lots' is not a size" in field(html, "memory")
    assert "'NOEQUALS' is not NAME=value" in field(html, "env")
    assert 'id="plan"' not in html
    html = client.post("/deploy/", form(source="ftp://x", tensor_parallel="2")).content.decode()
    assert "neither an absolute path" in field(html, "source")
    # A rule across fields names where it is, above the form.
    assert "tensor_parallel above 1 needs gpus_per_rank" in html
    assert not Model.objects.exists() and not Event.objects.exclude(kind__in=ACCOUNT_KINDS).exists()


def test_the_verbs_refusals_land_on_their_fields_too(operator):
    apply_catalog(GEMMA, actor=SETUP)
    client = signed_in(operator)
    html = client.post("/deploy/", form(name="gemma")).content.decode()
    assert "'gemma' is already served by model" in field(html, "name")
    html = client.post("/deploy/", form(engine_version="b1")).content.decode()
    assert "llama.cpp b1 is not declared" in field(html, "engine_version")
    assert list(Model.objects.values_list("name", flat=True)) == ["gemma"]


def test_plan_shows_where_it_would_go_and_changes_nothing(operator):
    heartbeating_node("node01")
    html = signed_in(operator).post("/deploy/", form()).content.decode()
    assert "+ model smollm-copy" in html and "+ profile smollm-copy/default" in html
    assert "New replica 1: 1/1 nodes available; placed on node01" in html
    assert 'name="planned"' in html and 'value="deploy"' in html
    assert not Model.objects.exists() and not Event.objects.exclude(kind__in=ACCOUNT_KINDS).exists()


def test_plan_lists_every_refusal_node_by_node(operator):
    heartbeating_node("node01")
    heartbeating_node("node02")
    html = signed_in(operator).post("/deploy/", form(memory="1TiB")).content.decode()
    assert 'data-placed="no"' in html
    assert "<li>node01: needs 1 TiB RAM free, has 44.7 GiB</li>" in html
    assert "<li>node02: needs 1 TiB RAM free, has 44.7 GiB</li>" in html


def test_deploy_applies_only_the_entry_that_was_planned(operator):
    heartbeating_node("node01")
    client = signed_in(operator)
    # No plan yet, or a form changed after its plan: planned again, applied not.
    for planned in ("", "0123456789abcdef"):
        html = client.post("/deploy/", form(action="deploy", planned=planned)).content.decode()
        assert REPLANNED in html and "placed on node01" in html
    assert not Model.objects.exists()
    planned = re.search(r'name="planned" value="(\w+)"', html).group(1)
    response = client.post("/deploy/", form(action="deploy", planned=planned))
    assert response.status_code == 302 and response["Location"] == "/models/smollm-copy/"
    profile = Profile.objects.get(model__name="smollm-copy")
    assert (profile.name, profile.memory, profile.replicas) == ("default", 512 * 1024**2, 1)
    event = Event.objects.get(subject="smollm-copy")
    assert event.actor == operator and event.reason.startswith("created from the pages")


def test_an_edit_that_restarts_nothing_is_saved_at_once(operator):
    apply_catalog(GEMMA, actor=SETUP)
    profile = Profile.objects.get()
    client = signed_in(operator)
    url = f"/profiles/{profile.id}/edit/"
    html = client.get(url).content.decode()
    assert 'value="2048"' in field(html, "context")
    assert 'value="--threads 2"' in field(html, "args")
    assert 'value="1GiB"' in field(html, "memory")
    data = {name: value for name, value in _posted(html).items()}
    response = client.post(url, {**data, "replicas": "3", "action": "save"})
    assert response.status_code == 302 and response["Location"] == "/models/gemma/"
    assert Profile.objects.get().replicas == 3
    event = Event.objects.filter(subject="gemma").first()
    assert event.actor == operator
    assert event.reason == "changed from the pages: ~ profile gemma/cpu: replicas 1 -> 3"


def test_an_edit_that_replaces_replicas_shows_its_plan_first(operator):
    heartbeating_node("node01")
    apply_catalog(GEMMA, actor=SETUP)
    profile = Profile.objects.get()
    make_replica(profile, state=ReplicaState.READY)
    client = signed_in(operator)
    url = f"/profiles/{profile.id}/edit/"
    data = {**_posted(client.get(url).content.decode()), "context": "4096", "action": "save"}
    html = client.post(url, data).content.decode()
    assert RESTARTS in html
    assert "~ profile gemma/cpu: context 2048 -&gt; 4096" in html
    assert "replaces its 1 running replica" in html
    assert Profile.objects.get().context == 2048
    planned = re.search(r'name="planned" value="(\w+)"', html).group(1)
    response = client.post(url, {**data, "planned": planned})
    assert response.status_code == 302
    assert Profile.objects.get().context == 4096


def test_an_edits_problems_show_on_its_fields(operator):
    apply_catalog(GEMMA, actor=SETUP)
    profile = Profile.objects.get()
    client = signed_in(operator)
    url = f"/profiles/{profile.id}/edit/"
    data = {**_posted(client.get(url).content.decode()), "replicas": "-2", "action": "save"}
    html = client.post(url, data).content.decode()
    assert "greater than or equal to 0" in field(html, "replicas")
    assert Profile.objects.get().replicas == 1


def test_an_operator_deletes_a_model(operator):
    apply_catalog(GEMMA, actor=SETUP)
    model = Model.objects.get()
    client = signed_in(operator)
    html = client.get("/models/gemma/").content.decode()
    assert f'hx-post="/catalog/models/{model.id}/delete/"' in html
    assert f'href="/profiles/{model.profiles.get().id}/edit/"' in html
    assert client.get(f"/catalog/models/{model.id}/delete/").status_code == 405
    response = client.post(f"/catalog/models/{model.id}/delete/", headers={"HX-Request": "true"})
    assert response.status_code == 204
    assert not Model.objects.exists()
    event = Event.objects.get(subject="model/gemma")
    assert event.actor == operator and event.reason == "deleted model gemma"
    assert client.post(f"/catalog/models/{model.id}/delete/").status_code == 404


def test_digests_are_what_the_form_planned():
    from catalog.schema import ModelEntry

    one = ModelEntry.model_validate({"name": "a", "source": "/a.gguf"})
    assert entry_digest(one) == entry_digest(ModelEntry.model_validate(one.model_dump()))


def _posted(html: str) -> dict[str, str]:
    """What the form as shown would post: every input's value and every select's choice."""
    data = {}
    for name, value in re.findall(r'<input type="text" name="(\w+)" value="([^"]*)"', html):
        data[name] = value.replace("&#x27;", "'").replace("&quot;", '"')
    for name, body in re.findall(r'<select name="(\w+)"[^>]*>(.*?)</select>', html, re.S):
        # As a browser does: the option selected, else the first.
        chosen = re.search(r'<option value="([^"]*)" selected>', body)
        data[name] = (chosen or re.search(r'<option value="([^"]*)"', body)).group(1)
    for name, body in re.findall(r'<textarea name="(\w+)"[^>]*>(.*?)</textarea>', html, re.S):
        data[name] = body.strip()
    return data
