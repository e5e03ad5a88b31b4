"""`llmgw_ctl drain` and `llmgw_ctl pool`: verbs run as the shell's user, whose name the
Events keep (the llmgw account of that name when there is one)."""

from __future__ import annotations

import pytest
from django.core.management import CommandError

from audit.models import Event
from catalog.models import Pool
from fleet.models import Node
from tests.ctl import ctl
from tests.factories import make_node

pytestmark = pytest.mark.django_db


@pytest.fixture
def at_the_shell(monkeypatch):
    """Run llmgw_ctl as the shell user "olga", not under sudo."""
    monkeypatch.delenv("SUDO_USER", raising=False)
    monkeypatch.setattr("audit.actors.getpass.getuser", lambda: "olga")


def test_a_drain_from_the_shell_names_the_llmgw_user_of_that_name(at_the_shell, operator):
    make_node("node07")

    ctl("drain", "node07")
    ctl("drain", "node07", "--undo")

    events = Event.objects.filter(subject="node07").order_by("id")
    assert [(e.description, e.actor) for e in events] == [
        ("drained by olga", operator),
        ("returned to service by olga", operator),
    ]


def test_a_shell_user_without_an_account_is_named_all_the_same(at_the_shell, monkeypatch):
    monkeypatch.setenv("SUDO_USER", "sam")  # sudo llmgw_ctl …: the one who ran sudo acted
    make_node("node07")

    ctl("drain", "node07")

    event = Event.objects.get(subject="node07")
    assert (event.actor, event.actor_name, event.description) == (None, "sam", "drained by sam")


def test_pool_puts_a_node_in_a_catalog_pool_and_takes_it_out(at_the_shell):
    Pool.objects.create(name="a100")
    make_node("node07")

    assert ctl("pool", "node07", "a100").strip() == "node07 is in pool a100"
    assert Node.objects.get(id="node07").pool == "a100"
    assert ctl("pool", "node07", "a100").strip() == "node07 was already in pool a100"
    assert ctl("pool", "node07", "--none").strip() == "node07 is in no pool"
    assert Node.objects.get(id="node07").pool == ""
    reasons = Event.objects.filter(subject="node07").order_by("id").values_list("reason", flat=True)
    assert list(reasons) == [
        "put in pool a100 (was in no pool)",
        "taken out of every pool (was in pool a100)",
    ]
    assert Event.objects.filter(subject="node07", actor_name="olga").count() == 2


def test_pool_refuses_an_unknown_node_or_pool_naming_the_known_ones(at_the_shell):
    Pool.objects.create(name="a100")
    Pool.objects.create(name="cpu")
    make_node("node07")

    with pytest.raises(CommandError, match=r"^no node 'ghost' \(nodes: node07\)$"):
        ctl("pool", "ghost", "a100")
    with pytest.raises(CommandError) as refused:
        ctl("pool", "node07", "h100")
    assert str(refused.value) == (
        "no pool 'h100' (pools: a100, cpu); apply a catalog that declares it first"
    )
    with pytest.raises(CommandError, match="say which pool"):
        ctl("pool", "node07")
    assert Node.objects.get(id="node07").pool == ""
    assert not Event.objects.filter(subject="node07").exists()
