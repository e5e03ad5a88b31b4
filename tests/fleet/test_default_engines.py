"""Rule R103, control plane side: a catalog that names no llama.cpp gets llmgw's default
build (the prebuilt xllamacpp wheel, pinned by hash), nodes are told to have it, its
profiles run on it, a catalog's own ``engines:`` replaces it, and every engine version says
where it came from. (A node installing it and serving on it:
tests/processes/test_default_engine.py.)"""

from __future__ import annotations

import json
import re
from io import StringIO

import pytest
from django.core.management import call_command
from pydantic import ValidationError

from catalog.actions.entries import apply_catalog
from catalog.models import (
    FROM_CATALOG,
    FROM_DEFAULT,
    FROM_NODE,
    Profile,
    engine_origins,
    newest_engine_versions,
)
from catalog.schema import CatalogError
from fleet.ctl.engines import engine_rows
from fleet.reconcile.engines import wanted_engines
from fleet.selectors import engine_row
from protocol.commands import CONVERGE_ENGINES
from protocol.engines import DEFAULT_LLAMA_CPP, EngineBuild, EngineInstall, WantedEngine
from tests.factories import SETUP
from tests.fleet.links import link, reconcile_now
from tests.fleet.queues import queued_commands

pytestmark = pytest.mark.django_db

DEFAULT = DEFAULT_LLAMA_CPP.version
SHA = "ab" * 32
MODEL = """
models:
  - name: gemma
    source: /models/gemma.gguf
    profiles:
      - name: cpu
        engine: llama.cpp
        memory: 1GiB{extra}
"""
OWN_ENGINE = f"""
engines:
  - name: llama.cpp
    version: b6000
    builds:
      - name: cpu-x64
        url: https://example.org/llama-b6000-bin-ubuntu-x64.tar.gz
        sha256: {SHA}
"""


@pytest.fixture(autouse=True)
def defaults_on(settings):
    """As a control plane runs unless told otherwise (the test suite turns them off)."""
    settings.DEFAULT_ENGINES = True


def catalog(extra: str = "", engines: str = "") -> str:
    return engines + MODEL.format(extra=extra)


def test_a_catalog_without_engines_gets_the_default_and_nodes_are_told_to_install_it(
    node_ids, django_capture_on_commit_callbacks
):
    apply_catalog(catalog(), actor=SETUP)
    link(node_ids[0])

    reconcile_now(django_capture_on_commit_callbacks)

    assert wanted_engines() == [DEFAULT_LLAMA_CPP]
    [engines] = [args[0] for task, args in queued_commands(node_ids[0], orders=True)
                 if task == CONVERGE_ENGINES]  # fmt: skip
    [told] = [WantedEngine.model_validate(engine) for engine in engines]
    assert told.version == DEFAULT == "xllamacpp-2026.10.11549"
    # Each platform's wheel, pinned by the sha256 its agent's pip then requires.
    assert [(b.platform, b.pip, b.sha256[:8]) for b in told.builds] == [
        ("linux-x86_64", "xllamacpp==2026.10.11549", "c54e7d13"),
        ("linux-aarch64", "xllamacpp==2026.10.11549", "e2a3e79e"),
    ]
    assert Profile.objects.get().resolved_engine_version() == DEFAULT


def test_a_catalogs_own_llama_cpp_replaces_the_default_and_others_keep_it():
    apply_catalog(catalog(engines=OWN_ENGINE), actor=SETUP)
    assert [engine.key for engine in wanted_engines()] == [("llama.cpp", "b6000")]
    assert newest_engine_versions()["llama.cpp"] == "b6000"

    # Engines: naming only vLLM leaves llama.cpp's profiles the default.
    only_vllm = "engines:\n  - name: vllm\n    version: 0.10.1\n"
    apply_catalog(catalog(engines=only_vllm), actor=SETUP, prune=True)
    assert [engine.key for engine in wanted_engines()] == [
        ("vllm", "0.10.1"), ("llama.cpp", DEFAULT),
    ]  # fmt: skip


def test_the_default_switched_off_leaves_a_catalog_without_engines_naming_none(settings):
    settings.DEFAULT_ENGINES = False
    apply_catalog(catalog(), actor=SETUP)

    assert wanted_engines() == []
    assert Profile.objects.get().resolved_engine_version() == ""


def test_the_plan_says_an_unpinned_profile_moves_to_the_default():
    apply_catalog(catalog(engines=OWN_ENGINE), actor=SETUP)

    changes = apply_catalog(catalog(), prune=True, actor=SETUP)

    assert [change.describe() for change in changes] == [
        "- engine llama.cpp b6000",
        f"~ profile gemma/cpu: engine_version (llmgw's default llama.cpp) 'b6000' -> '{DEFAULT}'",
    ]


def test_a_profile_across_nodes_on_the_default_is_refused_with_the_way_out():
    with pytest.raises(CatalogError) as refused:
        apply_catalog(catalog("\n        nodes: 2"), actor=SETUP)

    [problem] = refused.value.problems
    assert problem.startswith("catalog.yaml: models[0] (gemma): profiles[0] (cpu): nodes: 2 ")
    assert f"which the default llama.cpp ({DEFAULT}, prebuilt from PyPI) does not have" in problem
    assert "pin engine_version: to a llama.cpp build with rpc-server" in problem
    # Pinned to a build the agent files name (found on the node), it is the operator's call.
    apply_catalog(catalog("\n        nodes: 2\n        engine_version: 11434.0.0"), actor=SETUP)
    # And a catalog's own build is its own too.
    apply_catalog(catalog("\n        nodes: 2", engines=OWN_ENGINE), actor=SETUP)


def test_every_engine_version_says_where_it_came_from(node_ids):
    apply_catalog(catalog(), actor=SETUP)
    found = EngineInstall(engine="llama.cpp", version="11434.0.0", path="/opt/llama-server",
                          detail="named in the agent file")  # fmt: skip
    default = EngineInstall(engine="llama.cpp", version=DEFAULT, path="/x", managed=True)
    old = EngineInstall(engine="llama.cpp", version="b5000", path="/y", managed=True)
    link(node_ids[0], found, default, old)

    origins = engine_origins()
    assert origins == {("llama.cpp", DEFAULT): FROM_DEFAULT}
    assert [engine_row(i, origins)["origin"] for i in (found, default, old)] == [
        FROM_NODE, FROM_DEFAULT,
        "catalog, no longer named (removed once no shard runs on it)",
    ]  # fmt: skip
    apply_catalog(catalog(engines=OWN_ENGINE), actor=SETUP)
    assert engine_origins() == {("llama.cpp", "b6000"): FROM_CATALOG}

    rows = {(row["version"], row["origin"]): row["nodes"] for row in engine_rows()}
    assert rows == {
        ("b6000", FROM_CATALOG): {},
        ("11434.0.0", FROM_NODE): {node_ids[0]: "installed"},
        ("b5000", "catalog, no longer named (removed once no shard runs on it)"): {
            node_ids[0]: "installed"
        },
        (DEFAULT, "default, no longer named (removed once no shard runs on it)"): {
            node_ids[0]: "installed"
        },
    }


def test_llmgw_ctl_engines_lists_them_with_their_builds(node_ids):
    apply_catalog(catalog(), actor=SETUP)
    pip = "pip install xllamacpp==2026.10.11549"
    installing = EngineInstall(engine="llama.cpp", version=DEFAULT, status="installing",
                               detail=pip, managed=True)  # fmt: skip
    link(node_ids[0], installing)

    call_command("llmgw_ctl", "engines", stdout=(out := StringIO()))
    table = out.getvalue()
    call_command("llmgw_ctl", "engines", "--json", stdout=(out := StringIO()))
    [row] = json.loads(out.getvalue())

    assert table.splitlines()[0].split() == ["ENGINE", "VERSION", "FROM", "NODES", "BUILT", "FROM"]
    assert f"llama.cpp  {DEFAULT}  default  1 installing" in table
    assert "linux-x86_64/cpu: pip xllamacpp==2026.10.11549 (sha256 c54e7d13520e…)" in table
    assert row["nodes"] == {node_ids[0]: "installing: pip install xllamacpp==2026.10.11549"}


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"url": "https://x/a.tar.gz", "pip": "xllamacpp==1"}, "and not both"),
        ({}, "needs either url: (an archive) or pip: (a prebuilt wheel"),
        ({"pip": "llama-cpp-python==0.3"}, "is not one of the prebuilt llama.cpp wheels"),
        ({"pip": "xllamacpp>=1"}, "write xllamacpp==VERSION"),
        ({"pip": "xllamacpp==1", "packages": ["libgomp1"]}, "a wheel brings its own libraries"),
    ],
    ids=["both", "neither", "another-package", "unpinned", "apt-packages"],
)
def test_a_build_is_an_archive_or_a_pinned_prebuilt_wheel(fields, says):
    with pytest.raises(ValidationError, match=re.escape(says)):
        EngineBuild(name="b", sha256=SHA, **fields)


def test_an_engine_row_saved_before_the_checks_is_left_out_with_its_reason(caplog):
    """A version saved before versions had to be one path component (an older release, a
    hand-edited row): nodes are told every other engine, and the log names the row and the
    fix; the pass does not fail for it."""
    from catalog.models import Engine

    apply_catalog(catalog(engines=OWN_ENGINE), actor=SETUP)
    Engine.objects.create(name="llama.cpp", version="b1/../../x", builds=[])

    assert [engine.key for engine in wanted_engines()] == [("llama.cpp", "b6000")]
    [said] = [r.getMessage() for r in caplog.records if "b1/../../x" in r.getMessage()]
    assert "not told to any node" in said and "llmgw_ctl apply" in said
