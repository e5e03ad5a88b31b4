"""Verbs on sign-in: a (username, address) pair locked out after too many failed passwords;
a person admitted through the OpenID Connect provider, with the roles its claims give; a
sign-in through it refused.

The lockout itself lives in Redis (``fleet.pages.sign_in``), shared by every control-plane
process; this records it in the Event log, where an operator looks for who was locked out.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from django.contrib.auth.models import Group, User
from django.db import transaction
from django.utils import timezone

from audit.actors import Actor
from audit.events import record_event
from audit.models import EventKind
from fleet.accounts.identities import ProviderIdentity


def record_lockout(username: str, address: str, failures: int, wait: str, *, actor: Actor) -> None:
    """Record that ``username`` must wait ``wait`` (in words) before signing in again from
    ``address``, after ``failures`` failed sign-ins."""
    record_event(
        EventKind.SIGN_IN,
        username,
        f"locked out from {address} for {wait} after {failures} failed sign-ins",
        to_state="locked",
        actor=actor,
    )


def admit_provider_user(
    issuer: str,
    subject: str,
    claims: Mapping[str, Any],
    roles: frozenset[str],
    managed: frozenset[str],
    *,
    provider: str,
    address: str,
    actor: Actor,
) -> User:
    """Sign in the person the provider vouched for: their account (made at their first
    sign-in), its groups among ``managed`` set to ``roles``, and the sign-in recorded.
    ``actor`` (llmgw's provider sign-in) makes the account and sets its roles; the person
    signs in.

    Groups outside ``managed`` are left as an admin set them; only the roles the map
    can give are the provider's to grant and take away, at every sign-in.
    """
    with transaction.atomic():
        identity = (
            ProviderIdentity.objects.select_for_update()
            .select_related("user")
            .filter(issuer=issuer, subject=subject)
            .first()
        )
        if identity is None:
            user = User(username=_free_username(claims, subject), email=_email(claims))
            user.set_unusable_password()  # signs in through the provider only
            user.save()
            identity = ProviderIdentity.objects.create(issuer=issuer, subject=subject, user=user)
            record_event(
                EventKind.SIGN_IN, user.username,
                f"account made at the first sign-in through {provider} (subject {subject})",
                to_state="created", actor=actor,
            )  # fmt: skip
        user = identity.user
        if user.is_active:
            _set_roles(user, roles, managed, provider, actor)
            ProviderIdentity.objects.filter(pk=identity.pk).update(last_sign_in_at=timezone.now())
            record_event(
                EventKind.SIGN_IN, user.username, f"signed in through {provider} from {address}",
                to_state="signed-in", actor=user,
            )  # fmt: skip
    return user


def record_refused_sign_in(reason: str, *, provider: str, address: str, actor: Actor) -> None:
    """Record a sign-in through the provider that was refused, and why."""
    record_event(
        EventKind.SIGN_IN, f"{provider} sign-in",
        f"refused from {address}: {reason}", to_state="refused", actor=actor,
    )  # fmt: skip


def _set_roles(
    user: User, roles: frozenset[str], managed: frozenset[str], provider: str, actor: Actor
) -> None:
    held = set(user.groups.filter(name__in=managed).values_list("name", flat=True))
    wanted = set(roles & managed)
    if held == wanted:
        return
    for name in wanted - held:
        user.groups.add(Group.objects.get_or_create(name=name)[0])
    user.groups.remove(*Group.objects.filter(name__in=held - wanted))
    record_event(
        EventKind.SIGN_IN, user.username,
        f"roles from {provider}: {_names(wanted)} (were {_names(held)})",
        to_state="roles", actor=actor,
    )  # fmt: skip


def _names(roles: set[str]) -> str:
    return ", ".join(sorted(roles)) or "none"


def _email(claims: Mapping[str, Any]) -> str:
    email = claims.get("email")
    return email if isinstance(email, str) and len(email) <= 254 else ""


def _free_username(claims: Mapping[str, Any], subject: str) -> str:
    """The name the provider gives the person, made unique: a local account of that name
    stays the local one's, and this person becomes ``name-2``."""
    for claim in ("preferred_username", "email", "nickname"):
        value = claims.get(claim)
        if isinstance(value, str) and value.strip():
            base = value.split("@")[0] if claim == "email" else value
            break
    else:
        base = subject
    base = re.sub(r"[^\w.@+-]", "-", base)[:140] or "user"
    name, number = base, 1
    while User.objects.filter(username__iexact=name).exists():
        number += 1
        name = f"{base}-{number}"
    return name
