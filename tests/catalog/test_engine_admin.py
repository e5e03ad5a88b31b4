"""A catalog editor is not root on nodes: what makes nodes run code of its author's
choosing (engine builds, apt packages, pip versions, loader and interpreter variables,
remote code) needs the engine-admin group, through every way into the catalog."""

from __future__ import annotations

import importlib

import pytest
import yaml
from django.apps import apps as django_apps
from django.contrib.auth.models import Group

from audit.actors import ShellUser
from audit.models import Event
from catalog.actions.entries import apply_catalog, apply_model
from catalog.engine_admin import EngineAdminRequired
from catalog.models import Engine, Model, Profile
from catalog.permissions import ENGINE_ADMINS_GROUP, OPERATORS_GROUP
from catalog.schema import ModelEntry
from tests.factories import SETUP, make_model, make_profile, make_user

pytestmark = pytest.mark.django_db

PROFILE = """
models:
  - name: gemma
    source: /m/gemma.gguf
    profiles:
      - name: cpu
        engine: {engine}
        replicas: {replicas}
        args: {args}
        env: {env}
"""
ENGINE = """
engines:
  - name: {name}
    version: "{version}"
{builds}"""
BUILDS = """    builds:
      - name: cpu-x64
        url: https://example.org/llama-b6000.tar.gz
        sha256: "{sha}"
        packages: [libgomp1]
"""


def profile(args=(), env=None, engine="llama.cpp", replicas=1) -> str:
    return PROFILE.format(
        engine=engine, replicas=replicas, args=yaml.safe_dump(list(args), default_flow_style=True),
        env=yaml.safe_dump(env or {}, default_flow_style=True).strip(),
    )  # fmt: skip


def engine(name="llama.cpp", version="b6000", builds=True) -> str:
    return ENGINE.format(name=name, version=version, builds=BUILDS.format(sha="a" * 64) * builds)


CODE_ON_NODES = {
    "ld-preload": (profile(env={"LD_PRELOAD": "/w/evil.so"}), "env LD_PRELOAD=/w/evil.so"),
    "ld-library-path": (profile(env={"LD_LIBRARY_PATH": "/w"}), "env LD_LIBRARY_PATH=/w"),
    "path": (profile(env={"PATH": "/w:/usr/bin"}), "env PATH=/w:/usr/bin"),
    "pythonpath": (profile(env={"PYTHONPATH": "/w"}), "env PYTHONPATH=/w"),
    "node-options": (profile(env={"NODE_OPTIONS": "--require /w/x.js"}), "env NODE_OPTIONS="),
    "bash-env": (profile(env={"BASH_ENV": "/w/x.sh"}), "env BASH_ENV=/w/x.sh"),
    "trust-remote-code": (profile(["--trust-remote-code"], engine="vllm"),
                          "args --trust-remote-code"),
    "trust-remote-code-underscored": (profile(["--trust_remote_code=true"], engine="vllm"),
                                      "args --trust_remote_code=true"),
    "trust-remote-code-abbreviated": (profile(["--trust-remote"], engine="vllm"),
                                      "args --trust-remote"),
    "tool-parser-plugin": (profile(["--tool-parser-plugin", "/w/p.py"], engine="vllm"),
                           "args --tool-parser-plugin /w/p.py"),
    "custom-logit-processor": (profile(["--enable-custom-logit-processor"], engine="sglang"),
                               "args --enable-custom-logit-processor"),
    "engine-build": (engine(), "engines: llama.cpp b6000: an engine version is installed"),
    "pip-version": (engine("vllm", "0.6.3", builds=False), "engines: vllm 0.6.3"),
}  # fmt: skip


@pytest.mark.parametrize("case", CODE_ON_NODES, ids=list(CODE_ON_NODES))
def test_an_operator_cannot_make_nodes_run_code_and_is_told_who_can(case, operator):
    text, named = CODE_ON_NODES[case]

    with pytest.raises(EngineAdminRequired) as refused:
        apply_catalog(text, actor=operator)

    problems = refused.value.problems
    assert any(named in p and "needs the engine-admin group" in p for p in problems), problems
    assert "ask an admin to add you to 'engine-admin'" in problems[-1]
    assert not Model.objects.exists() and not Engine.objects.exists()


@pytest.mark.parametrize("case", CODE_ON_NODES, ids=list(CODE_ON_NODES))
def test_an_engine_admin_may(case):
    text, _named = CODE_ON_NODES[case]
    admin = make_user("edna", operator=True, engine_admin=True)

    assert apply_catalog(text, actor=admin)


@pytest.mark.parametrize(
    "actor",
    [lambda: make_user("root", superuser=True), lambda: ShellUser("olga", None), lambda: SETUP],
    ids=["superuser", "llmgw_ctl-at-the-shell", "llmgw-itself"],
)
def test_superusers_the_shell_and_llmgw_itself_may(actor):
    assert apply_catalog(engine() + profile(env={"LD_PRELOAD": "/w/x.so"}), actor=actor())


def test_what_only_tunes_an_engine_needs_no_engine_admin(operator):
    harmless = profile(
        ["--threads", "4", "--no-trust-remote-code", "--tool-call-parser", "hermes"],
        env={"PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "4", "HF_HOME": "/scratch/hf"},
    )
    assert apply_catalog(harmless, actor=operator)


def test_an_operator_keeps_what_an_engine_admin_set_but_cannot_change_it(operator):
    admin = make_user("edna", engine_admin=True)
    set_by_admin = engine() + profile(["--threads", "2"], env={"LD_LIBRARY_PATH": "/opt/cuda"})
    apply_catalog(set_by_admin, actor=admin)

    kept = {"LD_LIBRARY_PATH": "/opt/cuda"}
    scaled = engine() + profile(["--threads", "4"], env=kept, replicas=3)
    assert apply_catalog(scaled, actor=operator)  # the engine and the variable, as they were
    assert Profile.objects.get().replicas == 3

    moved = engine() + profile(["--threads", "4"], env={"LD_LIBRARY_PATH": "/w"}, replicas=3)
    with pytest.raises(EngineAdminRequired, match="env LD_LIBRARY_PATH=/w"):
        apply_catalog(moved, actor=operator)
    assert Profile.objects.get().env == {"LD_LIBRARY_PATH": "/opt/cuda"}


def test_the_deploy_page_verb_refuses_the_same(operator):
    [model] = yaml.safe_load(profile(env={"LD_PRELOAD": "/x"}))["models"]
    entry = ModelEntry.model_validate(model)
    with pytest.raises(EngineAdminRequired, match="env LD_PRELOAD=/x"):
        apply_model(entry, creating=True, actor=operator)
    assert not Model.objects.exists()


def test_a_migration_makes_the_groups_for_admins_to_add_people_to():
    # Made by a migration (a flushing test elsewhere may have emptied the table since).
    groups = importlib.import_module("catalog.migrations.0007_permission_groups")
    Group.objects.all().delete()

    groups.create_groups(django_apps, None)

    assert set(Group.objects.values_list("name", flat=True)) == {
        OPERATORS_GROUP, ENGINE_ADMINS_GROUP
    }  # fmt: skip


def test_the_api_refuses_an_operator_with_403_naming_field_value_and_group(api_client, operator):
    api_client.force_authenticate(operator)
    make_model(name="gemma")
    body = {"model": "gemma", "name": "cpu", "engine": "llama.cpp", "env": {"LD_PRELOAD": "/x"}}

    created = api_client.post("/api/v1/profiles/", body, format="json")
    build = {"name": "b", "url": "https://e.org/b.tar.gz", "sha256": "a" * 64}
    engine_row = api_client.post(
        "/api/v1/engines/", {"name": "llama.cpp", "version": "b1", "builds": [build]}, format="json"
    )

    assert created.status_code == 403, created.json()
    assert "env LD_PRELOAD=/x" in created.json()["detail"][0]
    assert "engine-admin" in created.json()["detail"][0]
    assert engine_row.status_code == 403, engine_row.json()
    assert not Profile.objects.exists() and not Engine.objects.exists()


def test_the_api_lets_an_operator_change_the_rest_of_an_engine_admins_profile(api_client, operator):
    row = make_profile(env={"LD_LIBRARY_PATH": "/opt/cuda"}, args=["--trust-remote-code"])
    api_client.force_authenticate(operator)

    kept = api_client.patch(f"/api/v1/profiles/{row.id}/", {"replicas": 2}, format="json")
    changed = api_client.patch(
        f"/api/v1/profiles/{row.id}/", {"env": {"LD_LIBRARY_PATH": "/w"}}, format="json"
    )

    assert kept.status_code == 200, kept.json()
    assert changed.status_code == 403, changed.json()
    row.refresh_from_db()
    assert (row.replicas, row.env) == (2, {"LD_LIBRARY_PATH": "/opt/cuda"})
    assert not Event.objects.filter(reason__contains="env").exists()
