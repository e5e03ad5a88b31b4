"""`llmgw_ctl events`: the audit log at the shell, filtered as the page filters it."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.core.management import CommandError
from django.utils import timezone

from audit.models import Event
from catalog.actions.api_keys import create_key
from catalog.teams.actions import create_team, set_role
from tests.audit.events_made import log_of
from tests.ctl import ctl
from tests.factories import make_user

pytestmark = pytest.mark.django_db


@pytest.fixture
def log():
    now = timezone.now()
    Event.objects.all().delete()
    log_of(3, now - timedelta(hours=5), timedelta(hours=1), kind="node", subject="node07",
           actor_name="olga")  # fmt: skip
    log_of(2, now - timedelta(minutes=30), timedelta(minutes=1), kind="key", subject="sk-abc")


def test_events_filter_by_actor_kind_object_and_time_as_json(log):
    def subjects(*flags: str) -> list[tuple[str, str]]:
        return [(r["kind"], r["object"]) for r in json.loads(ctl("events", "--json", *flags))]

    assert len(subjects()) == 5
    assert subjects("--actor", "olga") == [("node", "node07")] * 3
    assert subjects("--actor", "llmgw", "--kind", "key") == [("key", "sk-abc")] * 2
    assert subjects("--object", "node") == [("node", "node07")] * 3
    assert subjects("--since", "1h") == [("key", "sk-abc")] * 2
    assert len(subjects("--since", "6h", "--until", "210m")) == 2  # 5 h and 4 h ago
    newest = json.loads(ctl("events", "--json", "--limit", "1"))
    assert [r["reason"] for r in newest] == ["event 1"]


def test_events_as_a_table_newest_first(log):
    lines = ctl("events", "--object", "node07", "--limit", "2").splitlines()
    assert lines[0].split() == ["AT", "KIND", "ACTOR", "OBJECT", "CHANGE", "REASON"]
    assert [line.split()[-1] for line in lines[1:3]] == ["2", "1"]  # event 2, event 1
    assert "olga" in lines[1]
    assert lines[-1] == "(the newest 2; --limit 0 for all, --json for a file)"
    assert ctl("events", "--actor", "nobody").strip() == "no events match this filter"


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--since", "yesterday"], "since: 'yesterday' is not a time"),
        (["--team", "search"], "team 'search': there is no such team"),
        (["--limit", "-1"], "--limit: give a number of events, or 0 for all"),
    ],
    ids=["a-time", "a-team", "a-limit"],
)
def test_what_cannot_be_asked_is_refused_in_words(log, flags, said):
    with pytest.raises(CommandError, match=said):
        ctl("events", *flags)


def test_events_of_a_team_are_its_own_its_members_acts_and_its_keys():
    Event.objects.all().delete()
    admin = make_user("root-ops", superuser=True)
    lena, otto = make_user("lena"), make_user("otto")
    create_team("search", actor=admin)
    create_team("sales", actor=admin)
    set_role("search", "lena", "lead", actor=admin)
    set_role("sales", "otto", "lead", actor=admin)
    search_key, _ = create_key("indexer", team="search", actor=lena)
    create_key("crm", team="sales", actor=otto)

    rows = json.loads(ctl("events", "--json", "--team", "search", "--limit", "0"))
    seen = {(r["kind"], r["object"]) for r in rows}
    assert ("team", "search") in seen  # made, and lena's role in it
    assert ("key", search_key.prefix) in seen  # its key, made by its lead
    assert not [r for r in rows if "sales" in r["object"] or "crm" in r["reason"]]
    assert {r["actor"] for r in rows} <= {"root-ops", "lena"}
