"""apply / export / delete: the catalog file is the source of truth, applied whole or not at all."""

from __future__ import annotations

import pytest
import yaml

from catalog.actions.entries import apply_catalog, delete_entry
from catalog.models import Engine, Model, Pool, Profile
from catalog.plan import export_catalog
from catalog.schema import CatalogError
from tests.catalog.catalogs import CATALOG
from tests.factories import SETUP

pytestmark = pytest.mark.django_db


def describe(changes):
    return [change.describe() for change in changes]


def test_apply_creates_everything_the_file_names():
    changes = apply_catalog(CATALOG, actor=SETUP)
    assert describe(changes) == [
        "+ engine llama.cpp b6000",
        "+ pool cpu",
        "+ model gemma-3-270m",
        "+ profile gemma-3-270m/cpu",
        "+ model qwen",
        "+ profile qwen/tp2",
    ]
    profile = Profile.objects.get(model__name="gemma-3-270m", name="cpu")
    assert profile.memory == 1024**3
    assert profile.args == ["--threads", "2"]
    assert Model.objects.get(name="gemma-3-270m").aliases == ["gemma"]
    qwen = Profile.objects.get(model__name="qwen")
    assert (qwen.gpu_memory, qwen.startup_timeout) == (40 * 1024**3, 600)


def test_apply_then_export_then_apply_changes_nothing():
    apply_catalog(CATALOG, actor=SETUP)
    exported = yaml.safe_dump(export_catalog(), sort_keys=False)
    assert apply_catalog(exported, actor=SETUP) == []
    assert apply_catalog(CATALOG, actor=SETUP) == []
    assert yaml.safe_load(exported)["models"][0]["profiles"][0]["memory"] == "1GiB"


def test_apply_reports_each_changed_field():
    apply_catalog(CATALOG, actor=SETUP)
    changed = CATALOG.replace("replicas: 1", "replicas: 3").replace("memory: 1GiB", "memory: 2GiB")
    assert describe(apply_catalog(changed, actor=SETUP)) == [
        "~ profile gemma-3-270m/cpu: replicas 1 -> 3, memory 1GiB -> 2GiB"
    ]
    assert Profile.objects.get(model__name="gemma-3-270m").replicas == 3


def test_dry_run_prints_changes_without_applying():
    changes = apply_catalog(CATALOG, dry_run=True, actor=SETUP)
    assert len(changes) == 6
    assert not Model.objects.exists()
    assert not Engine.objects.exists()


def test_without_prune_unnamed_entries_stay():
    apply_catalog(CATALOG, actor=SETUP)
    only_gemma = yaml.safe_load(CATALOG)
    only_gemma["models"] = only_gemma["models"][:1]
    assert apply_catalog(yaml.safe_dump(only_gemma), actor=SETUP) == []
    assert Model.objects.filter(name="qwen").exists()


def test_prune_removes_what_the_file_does_not_name():
    apply_catalog(CATALOG, actor=SETUP)
    only_gemma = yaml.safe_load(CATALOG)
    only_gemma["models"] = only_gemma["models"][:1]
    only_gemma["engines"] = []
    changes = apply_catalog(yaml.safe_dump(only_gemma), prune=True, actor=SETUP)
    assert describe(changes) == [
        "- engine llama.cpp b6000",
        # Unpinned, it ran the catalog's newest: now it runs the newest on its node.
        "~ profile gemma-3-270m/cpu: engine_version (the catalog's newest llama.cpp) 'b6000' -> ''",
        "- model qwen",
    ]
    assert list(Model.objects.values_list("name", flat=True)) == ["gemma-3-270m"]
    assert not Engine.objects.exists()


def test_a_profile_the_file_drops_is_deleted():
    apply_catalog(CATALOG, actor=SETUP)
    data = yaml.safe_load(CATALOG)
    data["models"][1]["profiles"] = []
    assert describe(apply_catalog(yaml.safe_dump(data), actor=SETUP)) == ["- profile qwen/tp2"]


def entry(path, value):
    """The catalog with one field of the first gemma profile (or model) replaced."""
    data = yaml.safe_load(CATALOG)
    target = data
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return yaml.safe_dump(data)


PROFILE = ("models", 0, "profiles", 0)
REFUSALS = [
    pytest.param(
        entry((*PROFILE, "args"), ["--host", "0.0.0.0"]),
        "catalog.yaml: models[0] (gemma-3-270m): profiles[0] (cpu): args sets --host, which "
        "llmgw chooses; remove it",
        id="owned-flag",
    ),
    pytest.param(
        entry((*PROFILE, "engine"), "llamacpp"),
        "catalog.yaml: models[0] (gemma-3-270m): profiles[0] (cpu): engine: unknown engine "
        "'llamacpp'; llmgw runs llama.cpp, vllm, sglang",
        id="unknown-engine",
    ),
    pytest.param(
        entry((*PROFILE, "replicas"), -2),
        "catalog.yaml: models[0] (gemma-3-270m): profiles[0] (cpu): replicas: "
        "Input should be greater than or equal to 0",
        id="negative-replicas",
    ),
    pytest.param(
        entry((*PROFILE, "memory"), "12 parsecs"),
        "catalog.yaml: models[0] (gemma-3-270m): profiles[0] (cpu): memory: '12 parsecs' is "
        "not a size; write it like 1GiB, 300MiB or 2GB",
        id="unparsable-size",
    ),
    pytest.param(
        entry((*PROFILE, "startup_timeout"), "soon"),
        "catalog.yaml: models[0] (gemma-3-270m): profiles[0] (cpu): startup_timeout: 'soon' "
        "is not a duration; write it like 600s, 10m or 1h",
        id="unparsable-duration",
    ),
    pytest.param(
        entry((*PROFILE, "replica"), 2),
        "catalog.yaml: models[0] (gemma-3-270m): profiles[0] (cpu): replica: unknown key "
        "'replica'; check its spelling",
        id="unknown-key",
    ),
    pytest.param(
        entry(("models", 1, "profiles", 0, "tensor_parallel"), 3),
        "catalog.yaml: models[1] (qwen): profiles[0] (tp2): tensor_parallel 3 does not divide "
        "gpus_per_rank 2; use a tensor_parallel that divides it",
        id="tensor-parallel-does-not-divide",
    ),
    pytest.param(
        entry((*PROFILE, "pool"), "gpu-big"),
        "catalog.yaml: models[0] (gemma-3-270m): profiles[0] (cpu): pool: 'gpu-big' is not "
        "declared; add it under pools:",
        id="undeclared-pool",
    ),
    pytest.param(
        entry((*PROFILE, "engine_version"), "b9999"),
        "catalog.yaml: models[0] (gemma-3-270m): profiles[0] (cpu): engine_version: llama.cpp "
        "b9999 is not declared; declared: b6000",
        id="undeclared-engine-version",
    ),
    pytest.param(
        entry(("models", 0, "source"), "./gemma.gguf"),
        "catalog.yaml: models[0] (gemma-3-270m): source: source './gemma.gguf' is neither "
        "an absolute path, an https:// URL nor a hub id like org/repo",
        id="relative-source",
    ),
    pytest.param(
        entry(("models", 1, "aliases"), ["gemma"]),
        "catalog.yaml: models[1] (qwen): 'gemma' is already a name of model 'gemma-3-270m'; "
        "clients could not tell them apart",
        id="alias-clash",
    ),
    pytest.param(
        "models: [",
        "catalog.yaml: not valid YAML",
        id="not-yaml",
    ),
]


@pytest.mark.parametrize(("text", "problem"), REFUSALS)
def test_a_refused_file_names_the_problem_and_applies_nothing(text, problem):
    apply_catalog(CATALOG, actor=SETUP)
    before = export_catalog()
    with pytest.raises(CatalogError) as refused:
        apply_catalog(text.replace("gemma-3-270m-q4", "changed-q4"), actor=SETUP)
    assert any(p.startswith(problem) for p in refused.value.problems), refused.value.problems
    assert export_catalog() == before


def test_every_problem_is_reported_at_once():
    data = yaml.safe_load(CATALOG)
    data["models"][0]["profiles"][0]["replicas"] = -1
    data["models"][1]["profiles"][0]["engine"] = "tgi"
    with pytest.raises(CatalogError) as refused:
        apply_catalog(yaml.safe_dump(data), actor=SETUP)
    assert len(refused.value.problems) == 2


def test_a_refused_file_on_an_empty_catalog_creates_nothing():
    with pytest.raises(CatalogError):
        apply_catalog(entry((*PROFILE, "pool"), "nowhere"), actor=SETUP)
    assert not Model.objects.exists() and not Pool.objects.exists()


def test_delete_model_removes_it_and_its_profiles():
    apply_catalog(CATALOG, actor=SETUP)
    assert delete_entry("model", "qwen", actor=SETUP) is True
    assert delete_entry("model", "qwen", actor=SETUP) is False
    assert not Profile.objects.filter(model__name="qwen").exists()


ENGINE_BUILD = """
engines:
  - name: {engine}
    version: "1"
    builds:
      - name: b
        url: https://example.org/b.tar.gz
        sha256: "{sha}"
        {field}
"""


@pytest.mark.parametrize(
    ("engine", "field", "problem"),
    [
        ("llama.cpp", "platform: windows-x64", "unknown platform 'windows-x64'; use one of"),
        ("llama.cpp", "accelerator: rocm", "unknown accelerator 'rocm'; use cpu, cuda, or cuda>="),
        ("vllm", "packages: []", "vllm is installed on each node with pip (vllm==1), not from"),
    ],
)
def test_an_engine_build_a_node_could_not_use_is_refused_naming_the_field(engine, field, problem):
    text = ENGINE_BUILD.format(engine=engine, sha="a" * 64, field=field)

    with pytest.raises(CatalogError) as refused:
        apply_catalog(text, actor=SETUP)

    assert any(problem in p for p in refused.value.problems), refused.value.problems
    if engine == "llama.cpp":
        assert any("builds" in p for p in refused.value.problems), refused.value.problems


ENGINE_NAMES = """
engines:
  - name: llama.cpp
    version: "{version}"
    builds:
      - name: "{build}"
        url: https://example.org/b.tar.gz
        sha256: "{sha}"
"""


@pytest.mark.parametrize(
    ("version", "build", "problem"),
    [
        ("b1/../x", "b", "engines[0] (llama.cpp): version: version 'b1/../x' is not usable"),
        ("..", "b", "engines[0] (llama.cpp): version: version '..' is not usable"),
        ("b1", "../b", "builds[0] (../b): name: build name '../b' is not usable"),
    ],
    ids=["version-climbs", "version-dotdot", "build-climbs"],
)
def test_an_engine_version_or_build_that_is_not_one_directory_name_is_refused(
    version, build, problem
):
    # A node joins both into the paths it downloads to and deletes, as root.
    text = ENGINE_NAMES.format(version=version, build=build, sha="a" * 64)

    with pytest.raises(CatalogError) as refused:
        apply_catalog(text, actor=SETUP)

    assert any(problem in p for p in refused.value.problems), refused.value.problems
    assert not Engine.objects.exists()


def test_a_profile_pinning_an_engine_version_that_climbs_out_is_refused():
    text = entry((*PROFILE, "engine_version"), "b1/../x")

    with pytest.raises(CatalogError) as refused:
        apply_catalog(text, actor=SETUP)

    assert any("engine_version: engine_version 'b1/../x' is not usable" in p
               for p in refused.value.problems), refused.value.problems  # fmt: skip


def test_build_packages_that_apt_would_read_as_options_are_refused():
    text = ENGINE_BUILD.format(
        engine="llama.cpp", sha="a" * 64, field='packages: [hello, "-o", "DPkg::Pre-Invoke::=sh"]'
    )

    with pytest.raises(CatalogError) as refused:
        apply_catalog(text, actor=SETUP)

    assert any("packages: '-o' is not a Debian package name" in p
               for p in refused.value.problems), refused.value.problems  # fmt: skip
