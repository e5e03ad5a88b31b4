"""Which engine version a replica runs is the control plane's decision: pinned, else the
catalog's newest for its engine, else the newest on the node placement chose. It rides in
the shard spec and the fingerprint, shows on every replica row, and a change of it is a
rolling restart. Real PostgreSQL and the real Redis broker."""

from __future__ import annotations

import json
from io import StringIO

import pytest
import yaml
from django.core.management import call_command
from django.test import Client

from audit.actors import AGENT_LINK
from catalog.actions.entries import apply_catalog
from catalog.models import Profile
from fleet.actions.reports import register_node, update_engines
from fleet.actions.shard_reports import record_shard_status
from fleet.models import Replica, Shard
from fleet.reconcile.passes import reconcile
from fleet.routing_table import routing_snapshot
from protocol import messages
from protocol.engines import EngineInstall
from protocol.shard import ShardSpec
from tests.factories import SETUP
from tests.fleet.inventories import inventory
from tests.fleet.queues import clear_queue, queued_commands

pytestmark = pytest.mark.django_db

SHA = "ab" * 32


def engine_entry(version: str) -> dict:
    url = f"https://example.org/llama-{version}-bin-ubuntu-x64.tar.gz"
    return {"name": "llama.cpp", "version": version,
            "builds": [{"name": "cpu-x64", "url": url, "sha256": SHA}]}  # fmt: skip


def catalog(*engine_versions: str, pinned: str = "", replicas: int = 1) -> str:
    profile = {"name": "cpu", "engine": "llama.cpp", "replicas": replicas, "memory": "1GiB"}
    if pinned:
        profile["engine_version"] = pinned
    data: dict = {"models": [{"name": "gemma", "source": "/models/gemma.gguf",
                              "profiles": [profile]}]}  # fmt: skip
    if engine_versions:
        data["engines"] = [engine_entry(v) for v in engine_versions]
    return yaml.safe_dump(data)


def installed(*versions: str, managed: bool = True) -> list[EngineInstall]:
    return [
        EngineInstall(engine="llama.cpp", version=v, path=f"/e/{v}/llama-server", managed=managed)
        for v in versions
    ]


def link(node_id: str, *versions: str) -> None:
    register_node(
        node_id,
        messages.Register(
            inventory=inventory(node_id), engines_probed=True, engines=installed(*versions)
        ),
        actor=AGENT_LINK,
    )


def run(capture):
    with capture(execute=True):
        return reconcile()


def started_specs(node_id: str) -> list[ShardSpec]:
    return [
        ShardSpec.model_validate_json(args[0])
        for task, args in queued_commands(node_id)
        if task == "agent.start_shard"
    ]


def report(capture, replica: Replica, state: str) -> None:
    with capture(execute=True):
        for shard in Shard.objects.filter(replica=replica).exclude(node=None):
            record_shard_status(
                shard.node_id,
                messages.ShardStatus(shard_id=shard.id, state=state),
                actor=AGENT_LINK,
            )


def test_an_unpinned_profile_runs_the_catalogs_newest_version_not_the_nodes(
    node_ids, django_capture_on_commit_callbacks
):
    # The node also has a newer build the catalog never named (from its agent file).
    link(node_ids[0], "b5000", "b9000", "b10000")
    apply_catalog(catalog("b5000", "b9000"), actor=SETUP)

    run(django_capture_on_commit_callbacks)

    replica = Replica.objects.get()
    [spec] = started_specs(node_ids[0])
    assert spec.engine_version == "b9000"  # b9000 > b5000, though "b5" > "b9" as text
    assert (replica.engine, replica.engine_version) == ("llama.cpp", "b9000")


def test_without_a_catalog_version_the_replica_runs_the_newest_on_its_node(
    node_ids, django_capture_on_commit_callbacks
):
    link(node_ids[0], "b9000", "b10000")
    apply_catalog(catalog(), actor=SETUP)

    run(django_capture_on_commit_callbacks)

    [spec] = started_specs(node_ids[0])
    assert spec.engine_version == "b10000"
    assert Replica.objects.get().engine_version == "b10000"


def test_a_pinned_version_is_the_one_run(node_ids, django_capture_on_commit_callbacks):
    link(node_ids[0], "b5000", "b9000")
    apply_catalog(catalog("b5000", "b9000", pinned="b5000"), actor=SETUP)

    run(django_capture_on_commit_callbacks)

    [spec] = started_specs(node_ids[0])
    assert spec.engine_version == "b5000"


def test_the_fingerprint_follows_the_catalogs_newest_version_of_an_unpinned_profile():
    apply_catalog(catalog("b5000"), actor=SETUP)
    before = Profile.objects.get().fingerprint()
    apply_catalog(catalog("b5000", "b6000"), actor=SETUP)
    after = Profile.objects.get().fingerprint()
    apply_catalog(catalog("b5000", "b6000", pinned="b5000"), actor=SETUP)
    pinned = Profile.objects.get().fingerprint()
    apply_catalog(catalog("b5000", "b6000", "b7000", pinned="b5000"), actor=SETUP)

    assert after != before
    assert Profile.objects.get().fingerprint() == pinned  # a pinned profile ignores new ones


def test_a_version_added_to_the_catalog_rolls_unpinned_replicas_while_the_old_one_serves(
    node_ids, django_capture_on_commit_callbacks
):
    capture = django_capture_on_commit_callbacks
    link(node_ids[0], "11434.0.0")  # the agent file's llama-server, as in `make run`
    apply_catalog(catalog(), actor=SETUP)
    run(capture)
    [old] = Replica.objects.all()
    report(capture, old, "ready")
    clear_queue(node_ids[0])

    apply_catalog(catalog("b9999"), actor=SETUP)
    run(capture)  # the node does not have b9999 yet: the new replica waits for it

    new = Replica.objects.exclude(id=old.id).get()
    assert new.engine_version == "b9999" and new.state == "unplaceable"
    assert any("llama.cpp b9999" in reason for reason in new.reasons), new.reasons
    old.refresh_from_db()
    assert old.state == "ready" and old.engine_version == "11434.0.0"
    [model] = routing_snapshot().models
    assert {e.replica for e in model.endpoints} == {str(old.id)}
    # Routers learn each replica's engine: whether a broken answer can move depends on it.
    assert {e.engine for e in model.endpoints} == {"llama.cpp"}

    update_engines(
        node_ids[0],
        messages.Engines(engines=installed("b9999") + installed("11434.0.0")),
        actor=AGENT_LINK,
    )
    run(capture)

    [spec] = started_specs(node_ids[0])
    assert (spec.replica_id, spec.engine_version) == (str(new.id), "b9999")
    assert spec.fingerprint == Profile.objects.get().fingerprint() != old.fingerprint


def test_every_replica_row_says_which_version_it_runs(
    node_ids, django_capture_on_commit_callbacks, reader
):
    link(node_ids[0], "b9000")
    apply_catalog(catalog(), actor=SETUP)
    run(django_capture_on_commit_callbacks)
    replica = Replica.objects.get()

    out = StringIO()
    call_command("llmgw_ctl", "replicas", stdout=out)
    assert "llama.cpp b9000" in out.getvalue()
    call_command("llmgw_ctl", "replicas", "--json", stdout=(out := StringIO()))
    [row] = json.loads(out.getvalue())
    assert (row["engine"], row["engine_version"]) == ("llama.cpp", "b9000")

    client = Client()
    client.force_login(reader)
    api = client.get(f"/api/v1/replicas/{replica.id}/").json()
    assert (api["engine"], api["engine_version"]) == ("llama.cpp", "b9000")
    for page in ("/models/gemma/", f"/nodes/{node_ids[0]}/", "/"):
        assert "llama.cpp b9000" in client.get(page).content.decode(), page


def test_the_plan_says_which_unpinned_profiles_a_new_version_restarts():
    apply_catalog(catalog("b5000"), actor=SETUP)

    changes = [
        c.describe() for c in apply_catalog(catalog("b5000", "b6000"), dry_run=True, actor=SETUP)
    ]
    pinned = apply_catalog(catalog("b5000", "b6000", pinned="b5000"), dry_run=True, actor=SETUP)

    assert changes == [
        "+ engine llama.cpp b6000",
        "~ profile gemma/cpu: engine_version (the catalog's newest llama.cpp) 'b5000' -> 'b6000'",
    ]
    assert [c.describe() for c in pinned] == [
        "+ engine llama.cpp b6000",
        "~ profile gemma/cpu: engine_version '' -> 'b5000'",
    ]


def test_the_model_page_says_which_version_an_unpinned_profile_resolves_to(reader):
    client = Client()
    client.force_login(reader)
    apply_catalog(catalog(), actor=SETUP)
    assert (
        "(the newest on the node it is placed on)" in client.get("/models/gemma/").content.decode()
    )

    apply_catalog(catalog("b5000", "b9000"), actor=SETUP)

    assert (
        'b9000 <span class="muted">(the catalog\'s newest)'
        in client.get("/models/gemma/").content.decode()
    )
