"""Limits on API keys: the verbs, `llmgw_ctl keys`, the REST API and what routers load."""

from __future__ import annotations

import time

import pytest
from django.core.management import CommandError
from django.test import override_settings
from rest_framework.test import APIClient

from audit.models import Event
from audit.redis import redis_client
from catalog.actions.api_keys import create_key, revoke_key, update_key
from catalog.keys import ApiKeyRefused, active_keys
from catalog.models import ApiKey
from protocol.rate_limits import counter_keys
from tests.ctl import ctl
from tests.factories import SETUP

pytestmark = pytest.mark.django_db


def test_ctl_creates_a_key_with_limits_that_routers_load():
    out = ctl("keys", "create", "team-a", "--rpm", "5", "--tpm", "1000", "--tokens-per-day",
              "50000", "--concurrency", "2", "--expires", "30d", "--priority", "high")  # fmt: skip
    row = ApiKey.objects.get(name="team-a")
    assert "created key" in out
    [loaded] = active_keys()
    assert loaded["limits"] == {
        "requests_per_minute": 5, "tokens_per_minute": 1000, "tokens_per_day": 50000,
        "concurrency": 2,
    }  # fmt: skip
    assert loaded["priority"] == "high"
    assert 29 * 86400 < loaded["expires_at"] - time.time() <= 30 * 86400
    event = Event.objects.get(subject=row.prefix)
    assert "5 requests per minute" in event.reason and "priority high" in event.reason


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--rpm", "0"], "requests_per_minute: 0 is not a limit"),
        (["--tpm", "-5"], "tokens_per_minute: -5 is not a limit"),
        (["--concurrency", "lots"], "--concurrency 'lots': give a whole number, or none"),
        (["--expires", "soon"], "--expires: 'soon' is not a duration"),
    ],
    ids=["zero", "negative", "not-a-number", "bad-expiry"],
)
def test_bad_limits_are_refused_naming_the_field(flags, message):
    with pytest.raises(CommandError, match=message):
        ctl("keys", "create", "team-a", *flags)
    assert not ApiKey.objects.exists()


def test_update_changes_and_clears_limits_and_tells_routers(django_capture_on_commit_callbacks):
    row, _key = create_key("team-a", limits={"requests_per_minute": 5}, actor=SETUP)
    with django_capture_on_commit_callbacks() as callbacks:
        out = ctl("keys", "update", "team-a", "--rpm", "none", "--tokens-per-month", "9000")
    row.refresh_from_db()
    assert (row.requests_per_minute, row.tokens_per_month) == (None, 9000)
    assert "9000 tokens/month" in out
    assert callbacks, "routers are told"
    assert Event.objects.filter(subject=row.prefix, reason__startswith="updated").exists()


def test_limits_on_a_revoked_key_are_refused():
    row, _key = create_key("team-a", actor=SETUP)
    revoke_key(row.prefix, actor=SETUP)
    with pytest.raises(ApiKeyRefused, match="is revoked; limits on it would never apply"):
        update_key(row.prefix, limits={"requests_per_minute": 5}, actor=SETUP)


def test_show_reads_the_routers_counters():
    row, _key = create_key(
        "team-a", limits={"requests_per_minute": 10, "tokens_per_day": 1000}, actor=SETUP
    )
    now = time.time()
    counters = counter_keys(row.prefix, now)
    client = redis_client()
    client.zadd(counters.requests, {"r1": int(now * 1000) - 1000, "r2": int(now * 1000) - 500})
    client.incrby(counters.day, 250)
    try:
        out = ctl("keys", "show", row.prefix)
    finally:
        client.delete(*counters)
    assert "requests per minute" in out
    rows = {line.split("  ")[0]: line.split()[-3:] for line in out.splitlines()}
    assert rows["tokens per UTC day"] == ["1000", "250", "25%"]
    assert rows["requests per minute"] == ["10", "2", "20%"]


def test_show_without_redis_says_so():
    row, _key = create_key("team-a", actor=SETUP)
    with (
        override_settings(REDIS_URL="redis://127.0.0.1:1/0"),
        pytest.raises(CommandError, match="cannot read the routers' counters in Redis"),
    ):
        ctl("keys", "show", row.prefix)


def test_the_api_sets_limits_and_names_a_bad_one(operator):
    client = APIClient()
    client.force_authenticate(operator)
    created = client.post("/api/v1/keys/", {"name": "svc", "requests_per_minute": 60,
                                           "priority": "low"}, format="json")  # fmt: skip
    assert created.status_code == 201, created.json()
    assert created.json()["requests_per_minute"] == 60 and created.json()["key"]
    key_id = created.json()["id"]
    refused = client.patch(f"/api/v1/keys/{key_id}/", {"tokens_per_day": 0}, format="json")
    assert refused.status_code == 400
    assert "tokens_per_day" in refused.json()
    changed = client.patch(f"/api/v1/keys/{key_id}/", {"tokens_per_day": 500}, format="json")
    assert changed.status_code == 200, changed.json()
    row = ApiKey.objects.get(id=key_id)
    assert row.tokens_per_day == 500
    assert Event.objects.get(subject=row.prefix, reason__startswith="updated").actor == operator
