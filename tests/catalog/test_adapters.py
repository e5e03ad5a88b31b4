"""A model's LoRA adapters (issue 44): declared under ``adapters:``, checked against the
engines of the profiles that would serve them, written back by export, and never part of
a profile's fingerprint, so adding one restarts no replica."""

from __future__ import annotations

import pytest
import yaml

from catalog.actions.entries import apply_catalog, apply_model
from catalog.keys import known_model_names, open_model_names
from catalog.models import Model, Profile, Team
from catalog.plan import export_catalog
from catalog.schema import CatalogError, ModelEntry, ProfileEntry
from tests.factories import SETUP, make_profile, make_replica
from tests.gguf_files import llama_model

pytestmark = pytest.mark.django_db

ADAPTER = {"name": "test", "source": "/models/test-lora.gguf"}


def catalog(*adapters: dict, profiles: list[dict] | None = None, **model: object) -> str:
    entry = {
        "name": "smol",
        "source": "/models/smol.gguf",
        "profiles": profiles or [{"name": "cpu", "engine": "llama.cpp", "memory": "512MiB"}],
        "adapters": list(adapters),
        **model,
    }
    return yaml.safe_dump({"models": [entry]})


def refusal(text: str) -> str:
    with pytest.raises(CatalogError) as refused:
        apply_catalog(text, actor=SETUP)
    return "\n".join(refused.value.problems)


def test_adapters_are_stored_with_their_model_and_exported_back():
    apply_catalog(catalog({**ADAPTER, "scale": 0.5, "aliases": ["smol-test"]}), actor=SETUP)
    model = Model.objects.get()
    assert model.adapters == [
        {**ADAPTER, "sha256": "", "aliases": ["smol-test"], "scale": 0.5, "profiles": [],
         "description": ""}
    ]  # fmt: skip
    assert model.adapter_ids() == ["smol:test"]
    exported = export_catalog()["models"][0]["adapters"]
    assert exported == [{**ADAPTER, "aliases": ["smol-test"], "scale": 0.5}]
    assert apply_catalog(yaml.safe_dump(export_catalog()), actor=SETUP) == []


def test_adding_an_adapter_leaves_every_fingerprint_as_it_was():
    apply_catalog(catalog(), actor=SETUP)
    profile = Profile.objects.get()
    replica = make_replica(profile)
    changes = apply_catalog(catalog(ADAPTER), actor=SETUP)
    assert [(c.action, c.kind) for c in changes] == [("update", "model")]
    profile.refresh_from_db()
    # The reconciler replaces a replica whose fingerprint is not its profile's: none is.
    assert profile.fingerprint() == replica.fingerprint


def test_vllm_lora_settings_are_in_the_fingerprint_only_when_set():
    profile = make_profile(engine="vllm")
    before = profile.fingerprint()
    profile.max_loras = 4
    profile.save()
    assert profile.fingerprint() != before


def test_an_adapter_goes_to_the_profiles_it_names_and_otherwise_to_all():
    profiles = [
        {"name": "cpu", "engine": "llama.cpp"},
        {"name": "gpu", "engine": "vllm", "gpus_per_rank": 1, "max_loras": 4},
        {"name": "sg", "engine": "sglang", "gpus_per_rank": 1},
    ]
    only_gpu = {"name": "only-gpu", "source": "org/lora", "profiles": ["gpu"]}
    apply_catalog(catalog(ADAPTER, only_gpu, profiles=profiles), actor=SETUP)
    model = Model.objects.get()
    serving = {p.name: [a["name"] for a in model.adapters_for(p)] for p in model.profiles.all()}
    # SGLang is left out of "every profile": it serves none, and says so when named.
    assert serving == {"cpu": ["test"], "gpu": ["test", "only-gpu"], "sg": []}


@pytest.mark.parametrize(
    ("adapters", "profiles", "said"),
    [
        ([{**ADAPTER, "name": "a:b"}], None, "'a:b' is not a usable adapter name"),
        ([{**ADAPTER, "scale": 0}], None, "(test): scale: Input should be greater than 0"),
        ([{**ADAPTER, "source": "lora.gguf"}], None, "is neither an absolute path"),
        ([ADAPTER, ADAPTER], None, "adapters: test: named twice"),
        ([{**ADAPTER, "profiles": ["gpu"]}], None, "profiles: 'gpu' not among this model's"),
        (
            [{**ADAPTER, "source": "org/lora"}], None,
            "profile cpu runs llama.cpp: it loads a LoRA GGUF file and cannot fetch",
        ),
        (
            [ADAPTER], [{"name": "gpu", "engine": "vllm", "gpus_per_rank": 1}],
            "profile gpu runs vllm: its LoRA is off; set the profile's max_loras:",
        ),
        (
            [{**ADAPTER, "profiles": ["sg"]}], [{"name": "sg", "engine": "sglang"}],
            "profile sg runs sglang: llmgw does not yet give SGLang its LoRA flags",
        ),
        (
            [], [{"name": "cpu", "engine": "llama.cpp", "max_loras": 2}],
            "max_loras and max_lora_rank are vLLM's; llama.cpp loads every adapter",
        ),
        ([{**ADAPTER, "aliases": ["smol"]}], None, "'smol' is already a name of model 'smol'"),
    ],
    ids=[
        "name", "scale", "source", "twice", "unknown-profile", "hub-for-llama", "vllm-lora-off",
        "sglang", "max-loras-on-llama", "alias-taken",
    ],
)  # fmt: skip
def test_an_adapter_that_cannot_be_served_is_refused_naming_it_and_the_fix(
    adapters, profiles, said
):
    assert said in refusal(catalog(*adapters, profiles=profiles))
    assert not Model.objects.exists()


def test_an_adapter_id_another_model_already_has_is_refused():
    other = {"name": "smol:test", "source": "/models/other.gguf"}
    text = yaml.safe_dump({"models": [yaml.safe_load(catalog(ADAPTER))["models"][0], other]})
    assert "'smol:test' is already a name of adapter 'smol:test'" in refusal(text)


def test_a_form_that_shows_no_adapters_keeps_the_models_own():
    apply_catalog(catalog(ADAPTER), actor=SETUP)
    form = ModelEntry(
        name="smol", source="/models/smol.gguf", description="edited on its page",
        profiles=[ProfileEntry(name="cpu", engine="llama.cpp", memory=512 * 1024**2)],
    )  # fmt: skip
    apply_model(form, creating=False, actor=SETUP)
    model = Model.objects.get()
    assert (model.description, model.adapter_ids()) == ("edited on its page", ["smol:test"])


def test_the_estimate_adds_the_adapters_a_rank_holds(tmp_path):
    model = llama_model(tmp_path / "m.gguf", layers=8, embedding=512, heads=8, kv_heads=2,
                        feed_forward=1024, vocab=8000, context=4096, kind="f16")  # fmt: skip
    for name, size in (("a", 3 * 2**20), ("b", 5 * 2**20)):
        (tmp_path / f"{name}.gguf").write_bytes(b"\0" * size)
    adapters = [{"name": n, "source": str(tmp_path / f"{n}.gguf")} for n in ("a", "b")]
    apply_catalog(catalog(*adapters, source=str(model)), actor=SETUP)
    profile = Profile.objects.get()
    fit = profile.fit()
    assert fit.adapters == 8 * 2**20  # llama.cpp holds every adapter it loaded
    assert fit.total == fit.weights + fit.kv_cache + fit.buffers + fit.adapters
    assert "LoRA adapters " in profile.fit_line
    profile.engine, profile.max_loras = "vllm", 3
    assert profile.fit().adapters == 3 * 5 * 2**20  # max_loras of the largest at once


def test_the_rest_api_shows_a_models_adapters_and_an_edit_keeps_them(api_client, operator):
    apply_catalog(catalog(ADAPTER), actor=SETUP)
    model = Model.objects.get()
    api_client.force_authenticate(operator)
    shown = api_client.get(f"/api/v1/models/{model.id}/").json()
    assert [adapter["name"] for adapter in shown["adapters"]] == ["test"]
    edited = api_client.patch(f"/api/v1/models/{model.id}/", {"description": "edited"},
                              format="json")  # fmt: skip
    assert edited.status_code == 200, edited.json()
    assert Model.objects.get().adapter_ids() == ["smol:test"]


def test_a_model_closed_to_other_teams_closes_its_adapters_with_it():
    apply_catalog(catalog({**ADAPTER, "aliases": ["smol-test"]}), actor=SETUP)
    Team.objects.create(name="theirs")
    Model.objects.get().teams.add(Team.objects.create(name="ours"))
    usable = open_model_names()
    assert {"smol", "smol:test", "smol-test"} <= usable["ours"]
    assert not {"smol", "smol:test", "smol-test"} & usable["theirs"]
    assert {"smol:test", "smol-test"} <= known_model_names()  # a key may name an adapter
