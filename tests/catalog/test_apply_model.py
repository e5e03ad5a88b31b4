"""apply_model: one model as a page's form describes it, created or changed through the same
plan as a catalog file, with an Event naming who asked."""

from __future__ import annotations

import pytest

from audit.models import Event
from catalog.actions.entries import apply_catalog, apply_model
from catalog.models import Model, Profile
from catalog.schema import CatalogError, ModelEntry
from tests.catalog.catalogs import CATALOG
from tests.factories import SETUP

pytestmark = pytest.mark.django_db


def entry(name="smollm-copy", **profile) -> ModelEntry:
    profile = {"name": "cpu", "engine": "llama.cpp", "memory": "512MiB", **profile}
    return ModelEntry.model_validate(
        {"name": name, "source": "/models/smollm.gguf", "profiles": [profile]}
    )


def test_a_new_model_is_created_with_its_profile_and_an_event_naming_the_operator(operator):
    changes = apply_model(entry(), creating=True, actor=operator)
    assert [c.describe() for c in changes] == ["+ model smollm-copy", "+ profile smollm-copy/cpu"]
    profile = Profile.objects.get(model__name="smollm-copy")
    assert (profile.memory, profile.replicas) == (512 * 1024**2, 1)
    event = Event.objects.get(subject="smollm-copy")
    assert event.actor == operator
    assert event.description == (
        "created from the pages: + model smollm-copy, + profile smollm-copy/cpu by olga"
    )


def test_a_dry_run_plans_the_same_changes_and_writes_nothing(operator):
    # Events written before, not by it: a test elsewhere may leave one committed.
    events_before = set(Event.objects.values_list("id", flat=True))
    changes = apply_model(entry(), creating=True, dry_run=True, actor=operator)
    assert [c.describe() for c in changes] == ["+ model smollm-copy", "+ profile smollm-copy/cpu"]
    assert not Model.objects.exists()
    assert set(Event.objects.values_list("id", flat=True)) == events_before


def test_creating_refuses_a_name_or_alias_the_catalog_already_serves(operator):
    apply_catalog(CATALOG, actor=SETUP)
    for name in ("gemma-3-270m", "gemma"):
        with pytest.raises(CatalogError) as refused:
            apply_model(entry(name), creating=True, actor=operator)
        assert refused.value.problems[0].startswith(f"name: {name!r} is already served by")
    aliased = ModelEntry.model_validate(
        {"name": "new-one", "source": "/models/x.gguf", "aliases": ["qwen"]}
    )
    with pytest.raises(CatalogError) as refused:
        apply_model(aliased, creating=True, actor=operator)
    assert refused.value.problems[0].startswith("aliases: 'qwen' is already served by")
    assert Profile.objects.filter(model__name="gemma-3-270m").get().memory == 1024**3


def test_changing_a_model_updates_only_what_differs(operator):
    apply_model(entry(), creating=True, actor=operator)
    changes = apply_model(entry(context=4096), creating=False, actor=operator)
    assert [c.describe() for c in changes] == ["~ profile smollm-copy/cpu: context 0 -> 4096"]
    assert Profile.objects.get(model__name="smollm-copy").context == 4096
    latest = Event.objects.filter(subject="smollm-copy").first()
    assert latest.reason == "changed from the pages: ~ profile smollm-copy/cpu: context 0 -> 4096"


def test_changing_a_model_that_is_gone_is_refused(operator):
    with pytest.raises(CatalogError) as refused:
        apply_model(entry(), creating=False, actor=operator)
    assert refused.value.problems == ["name: no model is named 'smollm-copy' any more"]
    assert not Model.objects.exists()


def test_an_undeclared_pool_is_refused_naming_the_field(operator):
    with pytest.raises(CatalogError) as refused:
        apply_model(entry(pool="gpu"), creating=True, actor=operator)
    assert ": pool: 'gpu' is not declared" in refused.value.problems[0]
    assert not Model.objects.exists()
