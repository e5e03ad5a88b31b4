"""Verbs on accounts: a sign-in, a failed one, a change of fleet-wide roles.

Django says when each happens (``audit.receivers`` hears its signals), whichever way it
came: the pages' sign-in, the admin's, an identity provider's, a group changed in the
admin or at the shell. Each is recorded here as an Event about the account's username,
so one filter (``object=olga``) finds all that happened to an account.
"""

from __future__ import annotations

from collections.abc import Iterable

from django.contrib.auth.base_user import AbstractBaseUser

from audit.actors import Actor
from audit.events import record_event
from audit.models import EventKind

# Signing in by password, as the pages and the admin do: said without naming it.
BY_PASSWORD = "django.contrib.auth.backends.ModelBackend"  # noqa: S105 (a class path)


def record_sign_in(
    user: AbstractBaseUser, address: str, backend: str = "", *, actor: Actor
) -> None:
    """Record that ``user`` signed in from ``address``, and how when not by password."""
    how = f" through {backend.rsplit('.', 1)[-1]}" if backend and backend != BY_PASSWORD else ""
    record_event(
        EventKind.SIGN_IN, user.get_username(), f"signed in from {address}{how}",
        to_state="signed-in", actor=actor,
    )  # fmt: skip


def record_failed_sign_in(username: str, address: str, *, actor: Actor) -> None:
    """Record a sign-in as ``username`` from ``address`` that was refused (the name is
    what was typed: it may name no account)."""
    record_event(
        EventKind.SIGN_IN, username[:253] or "(no username)",
        f"sign-in refused from {address}", to_state="refused", actor=actor,
    )  # fmt: skip


def record_roles_changed(
    username: str, added: Iterable[str] = (), removed: Iterable[str] = (), *, actor: Actor
) -> None:
    """Record that ``username`` joined the groups ``added`` and left ``removed`` (the
    groups are its fleet-wide roles: operators, engine-admin, playground…)."""
    said = [
        *(f"added to {name}" for name in sorted(added)),
        *(f"removed from {name}" for name in sorted(removed)),
    ]
    if said:
        record_event(EventKind.ROLE, username, "; ".join(said), actor=actor)


def record_superuser_changed(username: str, superuser: bool, *, actor: Actor) -> None:
    """Record that ``username`` gained or lost the superuser flag (every role at once)."""
    record_event(
        EventKind.ROLE, username,
        "made a superuser (every role)" if superuser else "no longer a superuser",
        to_state="superuser" if superuser else "", actor=actor,
    )  # fmt: skip
