"""The playground's keys: short-lived, named for their user, one live key per user, with the
operator's limits at low priority, covering only the models the playground may use; and
expired keys leaving what routers load."""

from __future__ import annotations

import time
from dataclasses import replace
from datetime import timedelta

import pytest
import time_machine
from django.conf import settings
from django.utils import timezone

from audit.models import Event
from audit.redis import redis_client
from catalog.actions.api_keys import create_key
from catalog.keys import active_keys, hash_key
from catalog.models import ApiKey
from catalog.playground import (
    PlaygroundRefused,
    PlaygroundRules,
    issue_playground_key,
    may_use_playground,
)
from protocol.rate_limits import counter_keys
from router.table.keys import KeyCache
from tests.factories import SETUP, make_model, make_profile, make_user

pytestmark = pytest.mark.django_db

HOUR = 3600
RULES = PlaygroundRules(group="playground", lifetime=HOUR, requests_per_minute=20,
                        tokens_per_minute=20_000, tokens_per_day=1_000)  # fmt: skip


@pytest.fixture
def chat_models():
    make_profile(make_model("gemma"))
    make_profile(make_model("smol", source="/m/smol.gguf"))
    make_profile(make_model("vectors", source="/m/v.gguf"), serves=["embeddings"])


@pytest.fixture
def player(db):
    return make_user("pia", playground=True)


def test_a_user_gets_a_key_of_their_own_that_expires_and_names_them(player, chat_models):
    now = timezone.now()
    issued = issue_playground_key(player, RULES)
    row = ApiKey.objects.get(prefix=issued.prefix)
    assert row.name == "playground: pia" and row.user == player
    assert row.hashed_key == hash_key(issued.key)
    assert timedelta(minutes=59) < row.expires_at - now <= timedelta(hours=1, seconds=5)
    assert issued.expires_at == row.expires_at
    # The routers load it like any other key, so its usage is counted under that name.
    assert [k["name"] for k in active_keys()] == ["playground: pia"]
    assert Event.objects.get(subject=row.prefix).actor == player


def test_the_key_carries_the_operators_limits_low_priority_and_only_chat_models(
    player, chat_models
):
    row = ApiKey.objects.get(prefix=issue_playground_key(player, RULES).prefix)
    assert (row.requests_per_minute, row.tokens_per_minute, row.tokens_per_day) == (
        20, 20_000, 1_000,
    )  # fmt: skip
    assert row.priority == "low"
    assert row.allowed_models == ["gemma", "smol"]  # never empty, which would mean all
    named = issue_playground_key(player, replace(RULES, models=("smol",)))
    assert ApiKey.objects.get(prefix=named.prefix).allowed_models == ["smol"]


def test_without_a_chat_model_no_key_is_drawn(player):
    with pytest.raises(PlaygroundRefused, match="No model serves chat"):
        issue_playground_key(player, RULES)
    assert not ApiKey.objects.exists()


def test_a_renewal_revokes_the_previous_key_so_one_stays_live(player, chat_models):
    first = issue_playground_key(player, RULES)
    second = issue_playground_key(player, RULES)  # a cleared session asks again
    third = issue_playground_key(player, RULES)
    live = ApiKey.objects.filter(user=player, revoked_at__isnull=True)
    assert [k.prefix for k in live] == [third.prefix]
    assert {first.prefix, second.prefix, third.prefix} == set(
        ApiKey.objects.filter(user=player).values_list("prefix", flat=True)
    )
    # Another user's key is theirs, untouched.
    other = issue_playground_key(make_user("otto", playground=True), RULES)
    assert ApiKey.objects.get(prefix=other.prefix).revoked_at is None
    assert ApiKey.objects.get(prefix=third.prefix).revoked_at is None


def test_a_renewal_is_no_fresh_day_budget(player, chat_models):
    first = issue_playground_key(player, RULES)
    redis_client().set(counter_keys(first.prefix, time.time()).day, 700)  # what routers charged
    second = issue_playground_key(player, RULES)
    assert ApiKey.objects.get(prefix=second.prefix).tokens_per_day == 300
    redis_client().set(counter_keys(second.prefix, time.time()).day, 300)
    with pytest.raises(PlaygroundRefused, match="spent today's 1000 tokens") as refused:
        issue_playground_key(player, RULES)
    assert refused.value.status == 429


def test_the_session_keeps_a_reference_never_the_key(player, chat_models):
    issued = issue_playground_key(player, RULES)
    reference = issued.reference()
    assert issued.key not in str(reference) and reference["prefix"] == issued.prefix


def test_only_the_group_and_superusers_may_use_it(player, reader, operator, admin_user):
    assert may_use_playground(player, RULES) and may_use_playground(admin_user, RULES)
    assert not may_use_playground(reader, RULES) and not may_use_playground(operator, RULES)
    assert settings.PLAYGROUND_GROUP == "playground"


def test_keys_expired_over_an_hour_leave_what_routers_load():
    now = timezone.now()
    for name, expires_at in (("long-gone", now - timedelta(hours=2)),
                             ("just-expired", now - timedelta(minutes=30)),
                             ("live", now + timedelta(hours=1)), ("forever", None)):  # fmt: skip
        with time_machine.travel(now - timedelta(hours=3)):
            create_key(name, expires_at=expires_at, actor=SETUP)
    # Just expired: still loaded, so its client is told it expired rather than unknown.
    assert sorted(k["name"] for k in active_keys()) == ["forever", "just-expired", "live"]


def test_the_router_drops_keys_expired_over_an_hour_whatever_table_they_came_in():
    cache = KeyCache()
    now = time.time()
    cache.replace([
        {"name": n, "prefix": n, "sha256": n, "models": [], "expires_at": at}
        for n, at in (("long-gone", now - 2 * HOUR), ("just-expired", now - HOUR / 2),
                      ("forever", None))
    ])  # fmt: skip
    assert len(cache) == 2
