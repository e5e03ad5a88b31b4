"""Engines across the link, control plane side: nodes are told what to have, say how each
version stands, and placement, `llmgw_ctl nodes` and Events repeat the node's words."""

from __future__ import annotations

import json
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.utils import timezone

from audit.actors import AGENT_LINK
from audit.models import Event
from catalog.actions.entries import apply_catalog
from fleet.actions.nodes import drain_node, undrain_node
from fleet.actions.reports import update_engines
from fleet.models import Node, Replica
from protocol import messages
from protocol.commands import CONVERGE_ENGINES, DRAIN
from protocol.engines import EngineInstall, WantedEngine
from protocol.signing import verify
from tests.factories import SETUP
from tests.fleet.links import link, reconcile_now
from tests.fleet.queues import clear_queue, node_command_key, queued_commands, queued_signatures

pytestmark = pytest.mark.django_db

SHA = "ab" * 32
DOWNLOADING = "downloading llama-b6000-bin-ubuntu-x64.tar.gz (16 MiB, 40%)"
CATALOG = f"""
engines:
  - name: llama.cpp
    version: b6000
    builds:
      - name: cpu-x64
        url: https://example.org/llama-b6000-bin-ubuntu-x64.tar.gz
        sha256: {SHA}
        packages: [libgomp1]
      - name: cuda-x64
        url: https://example.org/llama-b6000-bin-ubuntu-cuda-x64.tar.gz
        sha256: {SHA}
        accelerator: cuda>=12.4
models:
  - name: gemma
    source: /models/gemma.gguf
    profiles:
      - name: cpu
        engine: llama.cpp
        engine_version: b6000
        memory: 1GiB
"""


def orders(node_id: str) -> list[tuple[str, list]]:
    return [(task, args) for task, args in queued_commands(node_id, orders=True)
            if task in (CONVERGE_ENGINES, DRAIN)]  # fmt: skip


def test_a_linked_node_is_told_the_catalogs_engines_signed_for_it_alone(
    node_ids, django_capture_on_commit_callbacks
):
    apply_catalog(CATALOG, actor=SETUP)
    link(node_ids[0])

    reconcile_now(django_capture_on_commit_callbacks)

    [(converge, [engines]), (drain, [draining])] = orders(node_ids[0])
    assert (converge, drain, draining) == (CONVERGE_ENGINES, DRAIN, False)
    [wanted] = [WantedEngine.model_validate(engine) for engine in engines]
    assert wanted.key == ("llama.cpp", "b6000")
    assert [(b.name, b.accelerator, b.packages) for b in wanted.builds] == [
        ("cpu-x64", "cpu", ["libgomp1"]),
        ("cuda-x64", "cuda>=12.4", []),
    ]
    [signed, _] = queued_signatures(node_ids[0], orders=True)
    task, args = CONVERGE_ENGINES, [engines]
    verify(node_command_key(node_ids[0]), task, args, **signed)


def test_a_node_is_told_again_on_a_catalog_change_a_relink_and_every_ten_minutes(
    node_ids, django_capture_on_commit_callbacks
):
    apply_catalog(CATALOG, actor=SETUP)
    link(node_ids[0])
    now = timezone.now() + timedelta(seconds=1)
    reconcile_now(django_capture_on_commit_callbacks, now)

    def told_after(moment) -> bool:
        clear_queue(node_ids[0])
        report = reconcile_now(django_capture_on_commit_callbacks, moment)
        return node_ids[0] in report.told_engines and bool(orders(node_ids[0]))

    assert not told_after(now + timedelta(seconds=2))  # nothing changed
    assert told_after(now + timedelta(minutes=10, seconds=1))
    later = now + timedelta(minutes=10, seconds=2)
    apply_catalog(CATALOG.replace("b6000", "b6001"), actor=SETUP)
    assert told_after(later)
    assert not told_after(later + timedelta(seconds=2))
    link(node_ids[0], now=later + timedelta(seconds=3))  # the agent restarted and forgot
    assert told_after(later + timedelta(seconds=4))


def test_an_unreachable_node_is_not_told(node_ids, django_capture_on_commit_callbacks):
    apply_catalog(CATALOG, actor=SETUP)
    link(node_ids[0])
    Node.objects.filter(id=node_ids[0]).update(state="unreachable")

    reconcile_now(django_capture_on_commit_callbacks)

    assert orders(node_ids[0]) == []


def test_draining_tells_the_agent_and_undraining_tells_it_again(
    node_ids, django_capture_on_commit_callbacks
):
    link(node_ids[0])
    with django_capture_on_commit_callbacks(execute=True):
        drain_node(node_ids[0], actor=SETUP)
    with django_capture_on_commit_callbacks(execute=True):
        undrain_node(node_ids[0], actor=SETUP)

    assert orders(node_ids[0]) == [(DRAIN, [True]), (DRAIN, [False])]


def installing(detail=DOWNLOADING) -> EngineInstall:
    return EngineInstall(
        engine="llama.cpp", version="b6000", status="installing", detail=detail, managed=True
    )


def failed(detail="libgomp.so.1 not found") -> EngineInstall:
    return EngineInstall(
        engine="llama.cpp", version="b6000", status="failed", detail=detail, managed=True
    )


def test_placement_refuses_in_the_nodes_own_words(node_ids, django_capture_on_commit_callbacks):
    apply_catalog(CATALOG, actor=SETUP)
    link(node_ids[0], installing())
    link(node_ids[1], failed())
    link(node_ids[2], EngineInstall(engine="llama.cpp", version="b5000", path="/opt/llama"))

    reconcile_now(django_capture_on_commit_callbacks)

    replica = Replica.objects.get()
    assert replica.state == "unplaceable"
    assert f"{node_ids[0]}: llama.cpp b6000 installing: {DOWNLOADING}" in replica.reasons
    assert f"{node_ids[1]}: llama.cpp b6000 failed: libgomp.so.1 not found" in replica.reasons
    assert f"{node_ids[2]}: engine llama.cpp b5000 installed, needs b6000" in replica.reasons


def test_the_install_that_ends_is_an_event_and_its_progress_is_not(node_ids):
    link(node_ids[0])

    for update in (installing(), installing("apt libgomp1"), failed(), installing()):
        update_engines(node_ids[0], messages.Engines(engines=[update]), actor=AGENT_LINK)
    installed = EngineInstall(
        engine="llama.cpp", version="b6000", path="/x/llama-server", managed=True
    )
    update_engines(node_ids[0], messages.Engines(engines=[installed]), actor=AGENT_LINK)

    events = Event.objects.filter(subject=node_ids[0], reason__startswith="llama.cpp")
    assert list(events.order_by("at", "id").values_list("reason", flat=True)) == [
        "llama.cpp b6000 failed: libgomp.so.1 not found",
        "llama.cpp b6000 installed",
    ]
    node = Node.objects.get(id=node_ids[0])
    assert node.installed_engines() == {"llama.cpp": {"b6000"}}


def test_llmgw_ctl_nodes_shows_installs_in_progress_and_failed(node_ids):
    link(node_ids[0], installing(), failed().model_copy(update={"version": "b5999"}))
    link(node_ids[1], EngineInstall(engine="llama.cpp", version="b6000", path="/opt/ls"))
    out = StringIO()

    call_command("llmgw_ctl", "nodes", stdout=out)
    table = out.getvalue()
    call_command("llmgw_ctl", "nodes", "--json", stdout=(out := StringIO()))
    rows = {row["id"]: row for row in json.loads(out.getvalue())}

    assert (
        f"llama.cpp b5999 failed: libgomp.so.1 not found; llama.cpp b6000 installing: "
        f"{DOWNLOADING}" in table
    )
    assert [
        {key: engine[key] for key in ("engine", "version", "status", "managed", "detail")}
        for engine in rows[node_ids[0]]["engines"]
    ] == [
        {"engine": "llama.cpp", "version": "b5999", "status": "failed", "managed": True,
         "detail": "libgomp.so.1 not found"},
        {"engine": "llama.cpp", "version": "b6000", "status": "installing", "managed": True,
         "detail": DOWNLOADING},
    ]  # fmt: skip
    [named] = rows[node_ids[1]]["engines"]
    assert (named["status"], named["managed"]) == ("installed", False)
