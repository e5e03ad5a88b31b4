"""Hostile catalog files through `apply`: every one applies, or is refused with a
CatalogError naming the file and what is wrong, leaving the stored catalog as it was."""

from __future__ import annotations

import pytest
import yaml
from hypothesis import example, given
from hypothesis import strategies as st

from catalog.actions.entries import apply_catalog
from catalog.models import Engine, Model, Profile
from catalog.schema import CatalogError
from tests.factories import SETUP
from tests.fuzz.hostile import DEEP, mutated, raw_frames

pytestmark = pytest.mark.django_db

SHA = "0" * 64
CATALOG = {
    "engines": [{"name": "llama.cpp", "version": "b6000", "builds": [
        {"name": "cpu", "url": "https://example.invalid/l.tar.gz", "sha256": SHA}]}],
    "pools": [{"name": "gpu"}],
    "fabrics": [{"name": "ib0"}],
    "models": [{"name": "gemma", "source": "/m/gemma.gguf", "aliases": ["g"], "profiles": [
        {"name": "cpu", "engine": "llama.cpp", "replicas": 1, "memory": "1GiB",
         "args": ["--threads", "1"], "rollout": {"surge": 1, "unavailable": 0}}]}],
}  # fmt: skip
KEYS = ("models", "engines", "pools", "fabrics", "name", "profiles", "replicas")

# A few references to a list of references, each doubling what a naive reader walks.
ALIAS_BOMB = "a: &a [x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}]\n" for i in range(20)
) + "models: [*u]\n"  # fmt: skip

files = st.one_of(
    mutated([CATALOG], KEYS).map(lambda document: yaml.safe_dump(document, allow_unicode=True)),
    raw_frames,
    st.sampled_from(["models: " + "[" * DEEP, "models:\n  - " * 50, "!!python/object:os.system"]),
)


def stored() -> tuple:
    return tuple(sorted(map(str, kind.objects.values_list())) for kind in (Model, Profile, Engine))


@given(text=files)
@example(text=ALIAS_BOMB)
def test_hostile_catalog_files_are_refused_with_reasons(text):
    apply_catalog(yaml.safe_dump(CATALOG), actor=SETUP)
    before = stored()
    try:
        apply_catalog(text, "fuzz.yaml", actor=SETUP)
    except CatalogError as exc:
        assert exc.problems and all(p.startswith("fuzz.yaml") for p in exc.problems), exc.problems
        assert stored() == before
