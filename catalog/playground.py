"""The playground's keys: a signed-in user chats through the routers, never around them,
with a short-lived key of their own, so what they spend is counted and limited under their
name like any client's.

Only a key's hash is stored, so the page's session remembers the key itself and it is
reused while it stays good for a while; then a new one is drawn and the old one expires.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from audit.actors import Actor
from catalog.actions.api_keys import create_key
from catalog.keys import hash_key
from catalog.models import ApiKey

# A key this close to its expiry is not handed out again: a chat begun with it could
# outlive it. A quarter of its life at most, so even a short-lived key gets reused.
RENEW_BEFORE = timedelta(minutes=5)


@dataclass(frozen=True)
class PlaygroundKey:
    """A key the playground page sends to the routers, and until when they take it."""

    key: str
    prefix: str
    expires_at: datetime

    def as_session(self) -> dict[str, str]:
        return {"key": self.key, "prefix": self.prefix, "expires_at": self.expires_at.isoformat()}


def key_name(user: Actor) -> str:
    """Whose key it is, as the usage page and `llmgw_ctl keys list` show it."""
    return f"playground: {user}"[: ApiKey._meta.get_field("name").max_length]


def playground_key(user: Actor, remembered: Any, *, lifetime: int) -> PlaygroundKey:
    """``user``'s playground key: the one their session ``remembered`` while it stays good
    for a while, else a new one that expires ``lifetime`` seconds from now."""
    now = timezone.now()
    renew_before = min(RENEW_BEFORE, timedelta(seconds=lifetime) / 4)
    kept = _still_good(remembered, key_name(user), now + renew_before)
    if kept is not None:
        return kept
    row, key = create_key(key_name(user), expires_at=now + timedelta(seconds=lifetime), actor=user)
    assert row.expires_at is not None
    return PlaygroundKey(key=key, prefix=row.prefix, expires_at=row.expires_at)


def _still_good(remembered: Any, name: str, until: datetime) -> PlaygroundKey | None:
    """The remembered key, if it is this user's, unrevoked and unexpired until ``until``."""
    if not isinstance(remembered, dict):
        return None
    key, prefix = remembered.get("key"), remembered.get("prefix")
    if not isinstance(key, str) or not isinstance(prefix, str):
        return None
    row = ApiKey.objects.filter(
        prefix=prefix, name=name, revoked_at__isnull=True, expires_at__gt=until
    ).first()
    if row is None or not hmac.compare_digest(row.hashed_key, hash_key(key)):
        return None
    assert row.expires_at is not None
    return PlaygroundKey(key=key, prefix=row.prefix, expires_at=row.expires_at)
