"""The playground's keys: a member of the playground's group chats through the routers, never
around them, with a short-lived key of their own, so what they spend is counted and limited
under their name like any client's.

The rules are the operator's (``settings.PLAYGROUND_*``): who may (one group, and
superusers), which models (those that serve chat, or the ones the operator named), the
limits each key carries (requests and tokens per minute, tokens per UTC day) and the low
priority. Each account holds one live key: issuing one revokes the one before, and a new
key's day budget is what the account's keys left of the day's, so a renewal is never a
fresh budget. Only a key's hash is stored; the page's session keeps a reference to it (its
prefix and expiry), never the key, and the page's script holds the key itself in memory.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime, timedelta

import redis
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from audit.actors import Actor
from catalog.actions.api_keys import create_key, revoke_key
from catalog.keys import open_model_names
from catalog.models import ApiKey, Model
from catalog.teams.roles import DEFAULT_TEAM
from protocol.rate_limits import counter_keys


class PlaygroundRefused(Exception):
    """No key for now, with the HTTP status to answer and a message that says why."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class PlaygroundRules:
    """What the operator set for the playground; 0 or None: no such limit."""

    group: str
    lifetime: int  # seconds a key lives
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    tokens_per_day: int | None = None
    models: tuple[str, ...] = ()  # empty: every model that serves chat

    @classmethod
    def from_settings(cls) -> PlaygroundRules:
        return cls(
            group=settings.PLAYGROUND_GROUP,
            lifetime=settings.PLAYGROUND_KEY_LIFETIME,
            requests_per_minute=settings.PLAYGROUND_REQUESTS_PER_MINUTE or None,
            tokens_per_minute=settings.PLAYGROUND_TOKENS_PER_MINUTE or None,
            tokens_per_day=settings.PLAYGROUND_TOKENS_PER_DAY or None,
            models=tuple(settings.PLAYGROUND_MODELS),
        )

    def refusal(self) -> str:
        """What a signed-in user outside the group is told."""
        return (
            f"The playground is for the '{self.group}' group; ask an admin to add you to it "
            "(or an operator to name another group in LLMGW_PLAYGROUND_GROUP).\n"
        )


@dataclass(frozen=True)
class PlaygroundKey:
    """A key the playground page sends to the routers, and until when they take it."""

    key: str
    prefix: str
    expires_at: datetime

    def reference(self) -> dict[str, str]:
        """What the session keeps: which key it was given, never the key."""
        return {"prefix": self.prefix, "expires_at": self.expires_at.isoformat()}


def may_use_playground(user, rules: PlaygroundRules) -> bool:
    if not user or not user.is_authenticated:
        return False
    return user.is_superuser or user.groups.filter(name=rules.group).exists()


def key_name(user: Actor) -> str:
    """Whose key it is, as the usage page and `llmgw_ctl keys list` show it."""
    return f"playground: {user}"[: ApiKey._meta.get_field("name").max_length]


def playground_models(rules: PlaygroundRules) -> list[str]:
    """The models a playground key covers: the operator's list, else every model that
    serves chat (the playground only chats); of those, the ones open to the team its keys
    are made in (``default``)."""
    if rules.models:
        named = sorted(rules.models)
    else:
        models = Model.objects.prefetch_related("profiles")
        named = sorted(model.name for model in models if "chat" in model.served_kinds)
    usable = open_model_names().get(DEFAULT_TEAM)
    return named if usable is None else [name for name in named if name in usable]


def issue_playground_key(user, rules: PlaygroundRules) -> PlaygroundKey:
    """A new key for ``user`` under ``rules``, revoking the one they held; refused when no
    model serves chat yet, or their keys spent the day's tokens."""
    models = playground_models(rules)
    if not models:
        raise PlaygroundRefused(503, "No model serves chat yet: deploy one first.")
    now = timezone.now()
    with transaction.atomic():
        # One issue at a time per account: two at once would leave two live keys.
        get_user_model().objects.select_for_update().filter(pk=user.pk).first()
        limits = {"requests_per_minute": rules.requests_per_minute,
                  "tokens_per_minute": rules.tokens_per_minute}  # fmt: skip
        if rules.tokens_per_day:
            left = rules.tokens_per_day - spent_today(user, now)
            if left < 1:
                raise PlaygroundRefused(
                    429,
                    f"Your playground keys spent today's {rules.tokens_per_day} tokens "
                    "(LLMGW_PLAYGROUND_TOKENS_PER_DAY); more at 00:00 UTC.",
                )
            limits["tokens_per_day"] = left
        for prefix in ApiKey.objects.filter(user=user, revoked_at__isnull=True).values_list(
            "prefix", flat=True
        ):
            revoke_key(prefix, actor=user)
        row, key = create_key(
            key_name(user), models, limits=limits, priority="low", user=user,
            expires_at=now + timedelta(seconds=rules.lifetime), actor=user,
        )  # fmt: skip
    assert row.expires_at is not None
    return PlaygroundKey(key=key, prefix=row.prefix, expires_at=row.expires_at)


def spent_today(user, now: datetime) -> int:
    """The tokens ``user``'s playground keys were charged this UTC day, from the routers'
    day counters; PlaygroundRefused when they cannot be read (a key then would be a fresh
    budget)."""
    from audit.redis import redis_client

    day_start = now.replace(hour=0, minute=0, second=0, microsecond=0)
    prefixes = list(
        ApiKey.objects.filter(user=user, created_at__lt=now)
        .exclude(expires_at__lt=day_start)
        .values_list("prefix", flat=True)
    )
    if not prefixes:
        return 0
    moment = time.time()
    try:
        counts = redis_client().mget([counter_keys(p, moment).day for p in prefixes])
    except redis.RedisError as exc:
        raise PlaygroundRefused(
            503, f"Cannot read what your playground keys spent today ({exc}); try again shortly."
        ) from None
    return sum(int(count or 0) for count in counts)
