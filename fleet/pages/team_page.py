"""What a team's page shows, and to whom: its members and roles, budgets and cap per key,
the models open to it, its keys (never a key itself), and where a person lands after
signing in. Its usage is the router's to read (``router.usage.views.team_usage``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.http import Http404
from django.shortcuts import resolve_url
from django.urls import reverse

from audit.actors import Actor
from catalog.keys import LIMIT_FIELDS, key_limits, open_model_names
from catalog.models import ApiKey, Membership, Model, Team
from catalog.permissions import is_operator
from catalog.teams.roles import has_role, key_cap, may_manage_key, role_in, teams_of


def readable_team(user: Actor, name: str) -> Team:
    """The team ``user`` may read: one they are in (any role), or any for an operator.
    Any other answers 404, as a team that does not exist: its name is not theirs to learn."""
    team = teams_of(user).filter(name=name).first()
    if team is None:
        raise Http404(f"no team named {name!r} among yours")
    return team


def landing(user: Actor) -> str:
    """Where a sign-in lands without ``next=``: a person in exactly one team, and no
    operator, on that team's page; everyone else on the cluster."""
    if not is_operator(user):
        names = list(teams_of(user).values_list("name", flat=True)[:2])
        if len(names) == 1:
            return reverse("team", args=[names[0]])
    return resolve_url(settings.LOGIN_REDIRECT_URL)


@dataclass(frozen=True)
class Limit:
    """One limit as the page says it: the team's budget (all its keys together) and its
    cap per key (each key alone); None is no limit."""

    name: str
    budget: int | None = None
    cap: int | None = None

    @property
    def words(self) -> str:
        return self.name.replace("_", " ")


def limits_of(team: Team) -> list[Limit]:
    cap = key_cap(team)
    return [Limit(name, getattr(team, name), getattr(cap, name)) for name in LIMIT_FIELDS]


def open_models(team: Team) -> list[Model]:
    """The catalog's models this team's keys may use (every model, while none is closed)."""
    usable = open_model_names().get(team.name)
    models = Model.objects.order_by("name")
    return list(models if usable is None else models.filter(name__in=usable))


def team_context(team: Team, user: Actor) -> dict[str, Any]:
    """The page's context: who is in the team, what it may spend and use, its keys, and
    what ``user`` may do there (a viewer only looks)."""
    keys = ApiKey.objects.filter(team=team).select_related("member").order_by(
        "revoked_at", "-created_at"
    )  # fmt: skip
    rows = [
        {
            "key": key,
            "limits": key_limits(key).as_dict(),
            "manageable": key.revoked_at is None and may_manage_key(user, key),
        }
        for key in keys
    ]
    memberships = team.memberships.select_related("user").order_by("user__username")
    return {
        "team": team,
        "role": role_in(user, team) or ("operator" if is_operator(user) else None),
        "members": memberships,
        "limits": limits_of(team),
        "models": open_models(team),
        "keys": rows,
        "may_create": has_role(user, team, Membership.Role.MEMBER),
        "may_pick_member": has_role(user, team, Membership.Role.LEAD),
        "limit_fields": [Limit(name) for name in LIMIT_FIELDS],
    }
