"""Verbs on API keys: create one (shown once), change its models, limits, expiry or
priority, revoke it. Routers apply each within a second of its commit."""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.utils import timezone

from audit import notices
from audit.actors import Actor
from audit.events import record_event
from audit.models import EventKind
from catalog.keys import (
    KEY_START,
    ApiKeyRefused,
    check_limits,
    check_priority,
    find_key,
    hash_key,
    key_limits,
    key_prefix,
    known_model_names,
    open_model_names,
)  # fmt: skip
from catalog.models import ApiKey, Team
from catalog.teams.roles import DEFAULT_TEAM, find_team


def create_key(
    name: str,
    allowed_models: Iterable[str] = (),
    *,
    limits: dict[str, int | None] | None = None,
    expires_at: datetime | None = None,
    priority: str = "normal",
    user: User | None = None,
    team: Team | str | None = None,
    member: User | None = None,
    actor: Actor,
) -> tuple[ApiKey, str]:
    """Create a key for ``name``; return the row and the key, which is never shown again.

    ``allowed_models`` limits the key to those models (names or aliases); empty allows
    every model. Names the catalog does not know are refused, so a typo cannot leave a
    key that silently works for nothing. ``limits`` are enforced by the routers together.
    ``user`` is the account the key is issued to (the playground's keys). ``team`` is the
    team it spends for (``default`` when none is named); its models must be open to it.
    ``member`` is the team member it is made for. Who may ask is the caller's to check
    (``catalog.teams``: a lead for the team, a member for themselves).
    """
    name = name.strip()
    if not name:
        raise ApiKeyRefused("a key needs a name saying who or what uses it")
    allowed = _known_models(allowed_models)
    owner = find_team(team) if team is not None else _default_team()
    _open_to(owner, allowed)
    if member is not None and not owner.memberships.filter(user=member).exists():
        raise ApiKeyRefused(
            f"member: {member.get_username()} is not in team {owner.name}; its lead adds them "
            f"first (`llmgw_ctl teams add-member {owner.name} {member.get_username()}`)"
        )
    checked = check_limits(limits or {})
    check_priority(priority)
    if expires_at is not None and expires_at <= timezone.now():
        raise ApiKeyRefused("expires: the key would be expired already; give a future time")
    for _attempt in range(5):
        key = KEY_START + secrets.token_urlsafe(32)
        try:
            with transaction.atomic():
                row = ApiKey.objects.create(
                    name=name,
                    prefix=key_prefix(key),
                    hashed_key=hash_key(key),
                    allowed_models=allowed,
                    expires_at=expires_at,
                    priority=priority,
                    user=user,
                    team=owner,
                    member=member,
                    **checked,
                )
                scope = ", ".join(allowed) or "every model"
                of = f" of team {owner.name}" + (f" for {member.get_username()}" if member else "")
                record_event(
                    EventKind.KEY, row.prefix,
                    f"created for {name}{of} ({scope}){_terms(row)}",
                    actor=actor,
                )  # fmt: skip
                notices.routers_reload_on_commit("keys")
        except IntegrityError:
            continue  # two keys drew the same prefix; draw again
        return row, key
    raise ApiKeyRefused("could not draw a unique key prefix; try again")


UNCHANGED: Any = object()


def update_key(
    identity: str,
    *,
    allowed_models: Iterable[str] | None = None,
    limits: dict[str, int | None] | None = None,
    expires_at: datetime | None = UNCHANGED,
    priority: str | None = None,
    actor: Actor,
) -> ApiKey:
    """Change a key's models, limits (None clears one), expiry or priority; routers apply
    it within a second. A revoked key is refused: nothing set on it would ever apply."""
    checked = check_limits(limits or {})
    if priority is not None:
        check_priority(priority)
    allowed = _known_models(allowed_models) if allowed_models is not None else None
    with transaction.atomic():
        row = ApiKey.objects.select_for_update().get(id=find_key(identity).id)
        if row.revoked_at is not None:
            raise ApiKeyRefused(
                f"key {row.prefix}… ({row.name}) is revoked; limits on it would never apply. "
                "Create a new key instead."
            )
        changes: dict[str, Any] = {**checked}
        if allowed is not None:
            _open_to(row.team, allowed)
            changes["allowed_models"] = allowed
        if expires_at is not UNCHANGED:
            changes["expires_at"] = expires_at
        if priority is not None:
            changes["priority"] = priority
        changed = [f for f, value in changes.items() if getattr(row, f) != value]
        if changed:
            for field, value in changes.items():
                setattr(row, field, value)
            row.save(update_fields=changed)
            record_event(
                EventKind.KEY, row.prefix,
                f"updated {', '.join(changed)} of {row.name}'s key{_terms(row)}", actor=actor,
            )  # fmt: skip
            notices.routers_reload_on_commit("keys")
    return row


def _known_models(allowed_models: Iterable[str]) -> list[str]:
    allowed = sorted({m.strip() for m in allowed_models if m.strip()})
    unknown = sorted(set(allowed) - known_model_names())
    if unknown:
        known = ", ".join(sorted(known_model_names())) or "none"
        raise ApiKeyRefused(
            f"unknown model(s) {', '.join(unknown)}; the catalog has: {known}. "
            "Apply the model first, or fix the name."
        )
    return allowed


def _default_team() -> Team:
    """``default``, made again where the database was emptied by hand since it migrated."""
    team, _made = Team.objects.get_or_create(name=DEFAULT_TEAM)
    return team


def _open_to(team: Team, allowed: list[str]) -> None:
    """A key cannot name a model closed to its team: it would never be served."""
    usable = open_model_names().get(team.name)
    closed = sorted(set(allowed) - usable) if usable is not None else []
    if closed:
        raise ApiKeyRefused(
            f"model(s) {', '.join(closed)} are not open to team {team.name}; it may use: "
            f"{', '.join(sorted(usable or ())) or 'none'}. An operator opens a model to it "
            "(`llmgw_ctl teams open`)."
        )


def _terms(row: ApiKey) -> str:
    """A key's limits, expiry and priority in an Event's words; "" when it has none."""
    terms = [
        f"{value} {name.replace('_', ' ')}" for name, value in key_limits(row).as_dict().items()
    ]
    if row.expires_at is not None:
        terms.append(f"expires {row.expires_at:%Y-%m-%d %H:%M} UTC")
    if row.priority != "normal":
        terms.append(f"priority {row.priority}")
    return f": {', '.join(terms)}" if terms else ""


def revoke_key(prefix: str, *, actor: Actor) -> ApiKey:
    """Revoke the key with this prefix (or this whole key); routers refuse it within a second."""
    prefix = key_prefix(prefix.strip())
    with transaction.atomic():
        row = ApiKey.objects.select_for_update().filter(prefix=prefix).first()
        if row is None:
            raise ApiKeyRefused(f"no key with prefix {prefix!r}; `llmgw_ctl keys list` shows them")
        if row.revoked_at is None:
            row.revoked_at = timezone.now()
            row.save(update_fields=["revoked_at"])
            record_event(EventKind.KEY, row.prefix, f"revoked (it was {row.name}'s)", actor=actor)
            notices.routers_reload_on_commit("keys")
    return row
