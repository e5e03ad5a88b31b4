"""Usage per key and model per day: `llmgw_ctl usage` and the usage page, from the rows
routers write."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.core.management import CommandError
from django.utils import timezone

from router.models import Usage
from tests.ctl import ctl

pytestmark = pytest.mark.django_db


@pytest.fixture
def spent():
    """Two keys over three days, written as routers write them: per hour."""
    this_hour = timezone.now().replace(minute=0, second=0, microsecond=0)
    rows = [
        (this_hour, "team-a", "llmgw-aaaa", "gemma", 3, 30, 12),
        (this_hour - timedelta(minutes=60), "team-a", "llmgw-aaaa", "gemma", 2, 20, 8),
        (this_hour - timedelta(days=2), "team-b", "llmgw-bbbb", "smol", 1, 5, 5),
        (this_hour - timedelta(days=40), "team-b", "llmgw-bbbb", "smol", 9, 99, 99),
    ]
    for hour, name, prefix, model, requests, prompt, completion in rows:
        Usage.objects.create(hour=hour, key_name=name, key_prefix=prefix, model=model,
                             requests=requests, prompt_tokens=prompt,
                             completion_tokens=completion)  # fmt: skip


def test_usage_adds_up_each_day_per_key_and_model(spent):
    rows = json.loads(ctl("usage", "--since", "7d", "--json"))
    by_key = {(r["key"], r["model"]): r for r in rows}
    assert set(by_key) == {("team-a", "gemma"), ("team-b", "smol")}  # day 40 is too old
    team_a = [r for r in rows if r["key"] == "team-a"]
    assert sum(r["requests"] for r in team_a) == 5
    assert sum(r["prompt_tokens"] + r["completion_tokens"] for r in team_a) == 70


def test_usage_for_one_key_by_name_or_prefix(spent):
    table = ctl("usage", "--key", "llmgw-bbbb", "--since", "60d")
    assert "team-a" not in table and table.count("team-b") == 2
    assert "no usage in the last 1 day(s) for key team-b" in ctl("usage", "--key", "team-b",
                                                                 "--since", "1d")  # fmt: skip


def test_usage_refuses_a_bad_window():
    with pytest.raises(CommandError, match="--since: 'a week' is not a duration"):
        ctl("usage", "--since", "a week")


def test_the_usage_page_shows_what_each_key_spent(client, reader, spent):
    client.force_login(reader)
    page = client.get("/usage/?days=30").content.decode()
    assert 'data-key="llmgw-aaaa" data-model="gemma"' in page
    assert 'data-key="llmgw-bbbb" data-model="smol"' in page
    assert "6 requests, 80 tokens" in page
    filtered = client.get("/usage/?days=30&key=team-a").content.decode()
    assert "llmgw-bbbb" not in filtered


def test_the_usage_page_needs_a_sign_in(client):
    assert client.get("/usage/").status_code == 302
