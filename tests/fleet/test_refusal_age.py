"""A refusal says when it was worked out, and an operator's action has it worked out again.

Why a replica cannot be placed is worked out again only every 30 to 60 s (at 10,000
nodes it costs a pass seconds); what pages, the API and llmgw_ctl show says how old it
is, and a drain, a pool, an apply or "check again" has the next pass work it out anew.
"""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
import time_machine
from django.utils import timezone

from audit.models import Event
from catalog.actions.entries import apply_catalog
from catalog.models import Pool
from fleet.actions.nodes import drain_node, set_node_pool
from fleet.actions.replicas import ReplicaRefused, check_placement_again
from fleet.models import Replica
from tests.ctl import ctl
from tests.factories import SETUP
from tests.fleet.cluster import catalog, connect, run

pytestmark = pytest.mark.django_db


def refused(node_ids, run_pass, clock) -> Replica:
    """gemma, which no node can run (none has its engine), refused at the clock's now."""
    connect(node_ids[0], engines=())
    apply_catalog(catalog(), actor=SETUP)
    run_pass()
    replica = Replica.objects.get()
    assert replica.state == "unplaceable"
    return replica


@pytest.fixture
def clock():
    with time_machine.travel(timezone.now(), tick=False) as traveller:
        yield traveller


@pytest.fixture
def run_pass(django_capture_on_commit_callbacks):
    return lambda: run(django_capture_on_commit_callbacks)


def test_a_refusal_keeps_the_time_it_was_worked_out(node_ids, run_pass, clock):
    worked_out = timezone.now()
    replica = refused(node_ids, run_pass, clock)
    assert replica.reasons_at == worked_out

    clock.shift(timedelta(seconds=10))
    connect(node_ids[1], engines=())  # an agent's news is no operator's action
    run_pass()
    replica.refresh_from_db()
    assert replica.reasons_at == worked_out
    assert replica.reasons[0].startswith("0/1 nodes available")


@pytest.mark.parametrize("action", ["drain", "pool", "apply", "check again"])
def test_an_operators_action_has_the_next_pass_work_the_refusal_out_again(
    node_ids, run_pass, clock, operator, action
):
    replica = refused(node_ids, run_pass, clock)
    clock.shift(timedelta(seconds=10))
    connect(node_ids[1], engines=())  # the refusal, worked out now, says 0/2

    clock.shift(timedelta(seconds=1))
    if action == "drain":
        drain_node(node_ids[1], actor=operator)
    elif action == "pool":
        Pool.objects.create(name="fast")
        set_node_pool(node_ids[1], "fast", actor=operator)
    elif action == "apply":
        apply_catalog(catalog(memory="2GiB"), actor=operator)
    else:
        assert check_placement_again("gemma", actor=operator) == 1
    clock.shift(timedelta(seconds=1))
    run_pass()

    replica.refresh_from_db()
    assert replica.reasons_at == timezone.now()
    assert replica.reasons[0].startswith("0/2 nodes available")


def test_check_again_is_an_event_naming_who_asked(node_ids, run_pass, clock, operator):
    refused(node_ids, run_pass, clock)

    check_placement_again("gemma", actor=operator)

    event = Event.objects.get(kind="placement", subject="gemma")
    assert event.description == "asked to work out again where gemma's replicas fit by olga"


def test_check_again_on_a_model_not_refused_says_so(node_ids, run_pass, operator):
    connect(node_ids[0])
    apply_catalog(catalog(), actor=SETUP)
    with pytest.raises(ReplicaRefused, match=r"no model 'gema' \(models: gemma\)"):
        check_placement_again("gema", actor=operator)
    run_pass()  # placed: starting
    with pytest.raises(ReplicaRefused, match="no replica of gemma is waiting for a node"):
        check_placement_again("gemma", actor=operator)


def test_pages_api_and_ctl_say_how_old_a_refusal_is(node_ids, run_pass, clock, client, operator):
    replica = refused(node_ids, run_pass, clock)
    clock.shift(timedelta(seconds=45))
    client.force_login(operator)

    page = client.get(f"/models/{replica.model_name}/").content.decode()
    node_page = client.get(f"/nodes/{node_ids[0]}/").content.decode()
    api = client.get("/api/v1/replicas/").json()
    said = ctl("replicas")
    as_json = json.loads(ctl("replicas", "--json"))

    assert "worked out 45 s ago" in page and "Check again" in page
    assert "worked out 45 s ago" in node_page and "engine llama.cpp not installed" in node_page
    [listed] = api["results"] if isinstance(api, dict) else api
    assert listed["reasons_at"] is not None
    assert "(worked out 45 s ago)" in said
    assert as_json[0]["reasons_worked_out"] == "45 s ago"


def test_check_again_from_the_shell(node_ids, run_pass, clock, monkeypatch):
    monkeypatch.delenv("SUDO_USER", raising=False)
    monkeypatch.setattr("audit.actors.getpass.getuser", lambda: "olga")
    refused(node_ids, run_pass, clock)

    said = ctl("check-placement", "gemma")

    assert said.strip() == (
        "gemma: 1 replica(s) waiting for a node; the next reconcile pass works out again why"
    )
    assert Event.objects.filter(kind="placement", subject="gemma").exists()
