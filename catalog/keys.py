"""The API keys clients send to ``/v1``: how they are drawn and stored, and what routers
load. Creating and revoking one are verbs in ``catalog.actions.api_keys``.

A key is 32 random bytes, so a single SHA-256 is enough to store it (a slow password
hash protects guessable secrets; this one cannot be guessed), and the router can check
a key with one hash and a dictionary lookup on every request.
"""

from __future__ import annotations

import hashlib
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Q
from django.utils import timezone

from catalog.models import ApiKey, Model, Team
from protocol.rate_limits import Limits, counter_keys
from protocol.routing import EXPIRED_KEYS_KEPT_SECONDS
from protocol.shard import adapter_id

KEY_START = "llmgw-"
# "llmgw-" and 8 random characters: enough to tell keys apart in a list, never to use one.
PREFIX_LENGTH = len(KEY_START) + 8


class ApiKeyRefused(Exception):
    """A key verb refused, with a message that names the key or model and the fix."""


def hash_key(key: str) -> str:
    """The stored form of a key (hex SHA-256)."""
    return hashlib.sha256(key.encode()).hexdigest()


def key_prefix(key: str) -> str:
    return key[:PREFIX_LENGTH]


# The limit fields of a key, as the model, the API and `llmgw_ctl` name them.
LIMIT_FIELDS = ("requests_per_minute", "tokens_per_minute", "tokens_per_day", "tokens_per_month",
                "concurrency")  # fmt: skip
PRIORITIES = ("high", "normal", "low")

# Flag, limit field and what it counts, as `llmgw_ctl keys` and `teams` name them, in the
# order `keys show` lists them.
LIMIT_FLAGS = (
    ("--rpm", "requests_per_minute", "requests per minute"),
    ("--tpm", "tokens_per_minute", "tokens per minute (prompt and completion)"),
    ("--tokens-per-day", "tokens_per_day", "tokens per UTC day"),
    ("--tokens-per-month", "tokens_per_month", "tokens per UTC month"),
    ("--concurrency", "concurrency", "requests in flight at once"),
)


def key_limits(key: ApiKey) -> Limits:
    """The limits set on the key."""
    return Limits(**{name: getattr(key, name) for name in LIMIT_FIELDS})


def capped(own: Limits, cap: Limits) -> tuple[Limits, list[str]]:
    """The smaller of a key's own limits and its team's cap, field by field, and the
    fields where the cap is the smaller (a refusal then names the team's cap)."""
    merged: dict[str, int | None] = {}
    by_cap = []
    for name in LIMIT_FIELDS:
        mine, theirs = getattr(own, name), getattr(cap, name)
        if theirs is not None and (mine is None or theirs < mine):
            merged[name] = theirs
            by_cap.append(name)
        else:
            merged[name] = mine
    return Limits(**merged), by_cap


def enforced_limits(key: ApiKey) -> Limits:
    """The limits routers hold the key to: its own within its team's cap per key, and the
    default cap on requests in flight (``LLMGW_KEY_CONCURRENCY``) where neither sets one."""
    from django.conf import settings

    limits, _by_cap = capped(key_limits(key), Limits.from_dict(key.team.key_cap))
    if limits.concurrency is None and settings.KEY_CONCURRENCY > 0:
        limits = replace(limits, concurrency=settings.KEY_CONCURRENCY)
    return limits


def check_limits(limits: dict[str, Any]) -> dict[str, int | None]:
    """The limits to set (None clears one), or ApiKeyRefused naming the first bad field."""
    checked: dict[str, int | None] = {}
    for name, value in limits.items():
        if name not in LIMIT_FIELDS:
            raise ApiKeyRefused(f"{name}: not a key limit; limits are {', '.join(LIMIT_FIELDS)}")
        if value is None:
            checked[name] = None
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ApiKeyRefused(
                f"{name}: {value!r} is not a limit; give a whole number of at least 1, "
                "or none for no limit"
            )
        checked[name] = value
    return checked


def check_priority(priority: str) -> str:
    if priority not in PRIORITIES:
        raise ApiKeyRefused(f"priority: {priority!r} is not one of {', '.join(PRIORITIES)}")
    return priority


def find_key(identity: str) -> ApiKey:
    """The key with this prefix (or whole key), else the one key with this name."""
    identity = identity.strip()
    row = ApiKey.objects.filter(prefix=key_prefix(identity)).first()
    if row is not None:
        return row
    named = list(ApiKey.objects.filter(name=identity, revoked_at__isnull=True)[:2])
    if len(named) == 1:
        return named[0]
    if named:
        raise ApiKeyRefused(
            f"several keys are named {identity!r}; give the prefix `llmgw_ctl keys list` shows"
        )
    raise ApiKeyRefused(
        f"no key with prefix or name {identity!r}; `llmgw_ctl keys list` shows them"
    )


EXPIRED_KEYS_KEPT = timedelta(seconds=EXPIRED_KEYS_KEPT_SECONDS)


def active_keys() -> list[dict[str, Any]]:
    """Every key that is not revoked nor expired for over ``EXPIRED_KEYS_KEPT``, as the
    router caches it (hashes, never keys), with its team: the team's name, budgets, the
    limits its cap set (``capped``), and the models it may use (None: every model)."""
    recently = timezone.now() - EXPIRED_KEYS_KEPT
    usable = open_model_names()
    keys = (
        ApiKey.objects.filter(revoked_at__isnull=True)
        .filter(Q(expires_at__isnull=True) | Q(expires_at__gt=recently))
        .select_related("team")
    )
    loaded = []
    for key in keys:
        team_models = usable.get(key.team.name)
        loaded.append({
            "name": key.name,
            "prefix": key.prefix,
            "sha256": key.hashed_key,
            "models": list(key.allowed_models),
            "limits": enforced_limits(key).as_dict(),
            "expires_at": _timestamp(key.expires_at),
            "priority": key.priority,
            "user": key.user_id,
            "team": key.team.name,
            "team_limits": team_limits(key.team).as_dict(),
            "capped": capped(key_limits(key), Limits.from_dict(key.team.key_cap))[1],
            "team_models": sorted(team_models) if team_models is not None else None,
        })  # fmt: skip
    return loaded


def _timestamp(moment: datetime | None) -> float | None:
    return moment.timestamp() if moment is not None else None


def team_limits(team: Team) -> Limits:
    """What all the team's keys may spend together."""
    return Limits(**{name: getattr(team, name) for name in LIMIT_FIELDS})


def open_model_names() -> dict[str, set[str] | None]:
    """Each team's usable models by name and alias; None for a team that may use every
    model (no model in the catalog is closed to it)."""
    everyone: set[str] = set()
    named: dict[int, set[str]] = {}
    closed_somewhere = False
    for model in Model.objects.prefetch_related("teams"):
        names = {model.name, *model.aliases, *adapter_names(model.adapters, model.name)}
        team_ids = [team.id for team in model.teams.all()]
        if not team_ids:
            everyone |= names
            continue
        closed_somewhere = True
        for team_id in team_ids:
            named.setdefault(team_id, set()).update(names)
    teams = Team.objects.values_list("id", "name")
    return {
        name: (everyone | named.get(team_id, set())) if closed_somewhere else None
        for team_id, name in teams
    }


def known_model_names() -> set[str]:
    names: set[str] = set()
    for name, aliases, adapters in Model.objects.values_list("name", "aliases", "adapters"):
        names.add(name)
        names.update(aliases)
        names.update(adapter_names(adapters, name))  # a key may be for an adapter alone
    return names


def adapter_names(adapters: list[dict], model: str) -> list[str]:
    """Every name a model's LoRA adapters are asked for by: each id and alias. A model
    closed to a team closes its adapters with it."""
    return [n for a in adapters for n in (adapter_id(model, a["name"]), *a.get("aliases", []))]


def usage_rows(limits: dict[str, int], used: dict[str, int]) -> list[list[str]]:
    """What `keys show` and `teams show` list: each limit, at most, used, and the share.
    Routers count only what a limit holds (a cap alone on requests in flight has no tokens
    counted in Redis: `llmgw_ctl usage` has them), so a limit not set shows no use."""
    return [
        [counts, str(limits[field]), str(used[field]), f"{100 * used[field] / limits[field]:.0f}%"]
        if limits.get(field) else [counts, "none", "-", ""]
        for _flag, field, counts in LIMIT_FLAGS
    ]  # fmt: skip


def key_usage(key: ApiKey, now: float) -> dict[str, int]:
    """What the routers counted against a key's limits, read from their Redis counters."""
    return counted_usage(key.prefix, now)


def counted_usage(counted_as: str, now: float) -> dict[str, int]:
    """What the routers counted under a key's prefix (or a team's counter name,
    ``protocol.rate_limits.team_counter_name``), read from their Redis counters."""
    from audit.redis import redis_client

    counters = counter_keys(counted_as, now)
    client = redis_client()
    with client.pipeline(transaction=False) as pipe:
        pipe.zcount(counters.requests, int((now - 60) * 1000) + 1, "+inf")
        pipe.hgetall(counters.tokens)
        pipe.get(counters.day)
        pipe.get(counters.month)
        pipe.zcount(counters.inflight, int(now * 1000) + 1, "+inf")
        requests, buckets, day, month, inflight = pipe.execute()
    minute = sum(int(n) for s, n in buckets.items() if int(s) > int(now) - 60)
    return {
        "requests_per_minute": requests,
        "tokens_per_minute": minute,
        "tokens_per_day": int(day or 0),
        "tokens_per_month": int(month or 0),
        "concurrency": inflight,
    }
