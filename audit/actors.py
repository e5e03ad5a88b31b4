"""Who acted: every verb is told, and its Event says so.

An operator acts through a page, the REST API or the admin (``request.user``), or at the
control plane's shell through ``llmgw_ctl`` (``shell_operator()``). llmgw acts by itself
through one of its parts (``RECONCILER``, ``AGENT_LINK``…): the Event then names no one,
as the log has always read "what llmgw did by itself".
"""

from __future__ import annotations

import getpass
import os
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TypeAlias

from django.contrib.auth import get_user_model
from django.contrib.auth.base_user import AbstractBaseUser
from django.contrib.auth.models import AnonymousUser


@dataclass(frozen=True)
class SystemActor:
    """A part of llmgw acting by itself; its Events name no user."""

    part: str

    def __str__(self) -> str:
        return f"llmgw's {self.part}"


@dataclass(frozen=True)
class ShellUser:
    """The account at the control plane's shell running ``llmgw_ctl``: the Event points at
    the llmgw user of that name (``account``) when there is one, and keeps the name when
    there is none. Acting from the shell is what it may do (``catalog.permissions``)."""

    username: str
    account: AbstractBaseUser | None = None

    def __str__(self) -> str:
        return self.username


# request.user is typed as either; views that act have made sure it is signed in.
Actor: TypeAlias = AbstractBaseUser | AnonymousUser | SystemActor | ShellUser

RECONCILER = SystemActor("reconciler")
# What a node's agent reports over its link (registers, shard statuses, engines, weights).
AGENT_LINK = SystemActor("agent link")
# The liveness check: silent nodes become unreachable, then lost.
LIVENESS = SystemActor("liveness check")
# Sign-in throttling: a username and address locked out after failed sign-ins.
SIGN_IN_THROTTLE = SystemActor("sign-in throttle")
# Sign-in through an OpenID Connect provider refused before anyone was known to sign in.
PROVIDER_SIGN_IN = SystemActor("provider sign-in")


def shell_operator() -> Actor:
    """The operator running ``llmgw_ctl``: the shell's user, and the llmgw user of that
    name if there is one.

    ``llmgw_ctl`` asks for no password: whoever runs it already holds the database, so the
    shell's account (the one ``sudo`` was run from, if any) is the only identity the
    machine vouches for.
    """
    name = os.environ.get("SUDO_USER") or getpass.getuser()
    return ShellUser(name, get_user_model()._default_manager.filter(username=name).first())


def recorded_as(actor: Actor) -> tuple[AbstractBaseUser | None, str]:
    """The user an Event points at (None: no account) and the name it keeps ("": llmgw)."""
    if isinstance(actor, AbstractBaseUser):
        return (actor if actor.pk else None), actor.get_username()
    if isinstance(actor, ShellUser):
        return actor.account, actor.username
    return None, ""


# Who is acting in this request or command, for changes Django reports by signal (a
# group changed in the admin), which carry no request: set by ``audit.middleware`` for
# every request, or by ``acting_as`` around a change made elsewhere.
_acting: ContextVar[Actor | None] = ContextVar("llmgw_acting", default=None)


@contextmanager
def acting_as(actor: Actor) -> Iterator[None]:
    """Name ``actor`` as who acts for the changes made inside (an identity provider's
    sign-in mapping a claim to groups says so with its own SystemActor)."""
    token = _acting.set(actor)
    try:
        yield
    finally:
        _acting.reset(token)


def acting_now() -> Actor:
    """Who is acting here: the request's user, or what ``acting_as`` named; else the
    account at the control plane's shell (a signal heard outside any request comes from
    a command or a shell there)."""
    actor = _acting.get()
    return actor if actor is not None else shell_operator()
