"""The playground's keys: short-lived, named for their user, reused while still good."""

from __future__ import annotations

from datetime import timedelta

import pytest
import time_machine
from django.utils import timezone

from audit.models import Event
from catalog.actions.api_keys import revoke_key
from catalog.keys import active_keys, hash_key
from catalog.models import ApiKey
from catalog.playground import PlaygroundKey, playground_key

pytestmark = pytest.mark.django_db

HOUR = 3600


def test_a_user_gets_a_key_of_their_own_that_expires_and_names_them(operator):
    now = timezone.now()
    issued = playground_key(operator, None, lifetime=HOUR)
    row = ApiKey.objects.get(prefix=issued.prefix)
    assert row.name == "playground: olga"
    assert row.hashed_key == hash_key(issued.key)
    assert timedelta(minutes=59) < row.expires_at - now <= timedelta(hours=1, seconds=5)
    assert issued.expires_at == row.expires_at
    # The routers load it like any other key, so its usage is counted under that name.
    assert [k["name"] for k in active_keys()] == ["playground: olga"]
    assert Event.objects.get(subject=row.prefix).actor == operator


def test_the_key_is_reused_while_it_stays_good_for_a_while(operator):
    first = playground_key(operator, None, lifetime=HOUR)
    remembered = first.as_session()
    assert playground_key(operator, remembered, lifetime=HOUR) == first
    with time_machine.travel(timezone.now() + timedelta(minutes=57)):
        # Minutes from expiry: a chat begun now could outlive it, so a new one is drawn.
        renewed = playground_key(operator, remembered, lifetime=HOUR)
    assert renewed.prefix != first.prefix
    assert ApiKey.objects.count() == 2


def test_a_revoked_key_or_another_users_key_is_never_reused(operator, reader):
    first = playground_key(operator, None, lifetime=HOUR)
    revoke_key(first.prefix, actor=operator)
    second = playground_key(operator, first.as_session(), lifetime=HOUR)
    assert second.prefix != first.prefix
    # A session that somehow holds another user's key gets the reader a key of their own.
    theirs = playground_key(reader, second.as_session(), lifetime=HOUR)
    assert ApiKey.objects.get(prefix=theirs.prefix).name == "playground: rita"


def test_a_remembered_key_that_does_not_parse_is_replaced(operator):
    for remembered in ({"key": "x"}, {"prefix": 1}, "garbage", {"key": "llmgw-x", "prefix": "y",
                       "expires_at": "not a time"}):  # fmt: skip
        assert isinstance(playground_key(operator, remembered, lifetime=HOUR), PlaygroundKey)
