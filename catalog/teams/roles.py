"""Teams as the verbs and the REST API read them: finding one, who holds which role in
it, what its keys may spend. Changing one is a verb in ``catalog.teams.actions``; what
routers load of a team is in ``catalog.keys``.

Roles, lowest first: a ``viewer`` sees the team's models, usage and keys' names; a
``member`` also makes keys for themselves within the team's limits; a ``lead`` manages the
team's keys, members and caps per key. An operator (``catalog.permissions``) may do all of
it for every team, and alone makes, changes and removes teams and opens models to them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db.models import QuerySet

from audit.actors import Actor, ShellUser, SystemActor, recorded_as
from catalog.keys import ApiKeyRefused, check_limits
from catalog.models import ApiKey, Membership, Team
from catalog.permissions import is_operator
from core.humanize import no_such
from protocol.rate_limits import Limits

DEFAULT_TEAM = "default"
ROLES = tuple(Membership.Role.values)  # lowest first
ROLE_RANK = {role: rank for rank, role in enumerate(ROLES)}


class TeamRefused(ApiKeyRefused):
    """A team verb refused, or an actor asked for what their role does not allow: the
    message names the team, the role, and who could do it."""


class RoleRequired(TeamRefused):
    """The actor's role does not allow it (a 403 in the REST API)."""


def find_team(name: str | Team) -> Team:
    if isinstance(name, Team):
        return name
    row = Team.objects.filter(name=name.strip()).first()
    if row is None:
        names = list(Team.objects.values_list("name", flat=True))
        raise TeamRefused(no_such("team", name, names))
    return row


def default_team() -> Team | None:
    """The team keys made without one belong to: the migration made it and it cannot be
    removed (``catalog.teams.actions.delete_team``); None in a database emptied by hand,
    where the first key made remakes it."""
    return Team.objects.filter(name=DEFAULT_TEAM).first()


def key_cap(team: Team) -> Limits:
    """What each key of the team may spend at most, whatever its own limits say."""
    return Limits.from_dict(team.key_cap)


def check_key_cap(cap: dict[str, Any]) -> dict[str, int]:
    """A cap per key to store (None drops a field), or TeamRefused naming the bad field."""
    checked = check_limits(cap)
    return {name: value for name, value in checked.items() if value is not None}


# --- Who may do what ------------------------------------------------------------------


def _account_id(actor: Actor) -> int | None:
    """The signed-in account's id; None for anyone else (llmgw's parts, the shell)."""
    if isinstance(actor, SystemActor | ShellUser) or not actor.is_authenticated:
        return None
    return actor.pk


def role_in(user: Actor, team: Team) -> str | None:
    """The user's role in ``team``; None when they hold none."""
    account = _account_id(user)
    if account is None:
        return None
    roles = Membership.objects.filter(team=team, user_id=account).values_list("role", flat=True)
    return roles.first()


def acts_for_fleet(actor: Actor) -> bool:
    """llmgw's own parts, ``llmgw_ctl`` at the shell and operators act for every team."""
    return isinstance(actor, SystemActor | ShellUser) or is_operator(actor)


def has_role(actor: Actor, team: Team, least: str) -> bool:
    """Whether ``actor`` holds ``least`` or a higher role in ``team`` (operators do)."""
    if acts_for_fleet(actor):
        return True
    role = role_in(actor, team)
    return role is not None and ROLE_RANK[role] >= ROLE_RANK[least]


def require_role(actor: Actor, team: Team, least: str, doing: str) -> None:
    if not has_role(actor, team, least):
        held = role_in(actor, team)
        holds = f"you are its {held}" if held else "you are not in it"
        raise RoleRequired(
            f"{doing} in team {team.name} needs its {least} role or higher ({holds}); "
            "ask its lead or an operator."
        )


def teams_of(actor: Actor) -> QuerySet[Team]:
    """The teams ``actor`` sees: every team for an operator, else those they are in."""
    if acts_for_fleet(actor):
        return Team.objects.all()
    account = _account_id(actor)
    if account is None:
        return Team.objects.none()
    return Team.objects.filter(memberships__user_id=account).distinct()


def keys_visible_to(actor: Actor) -> QuerySet[ApiKey]:
    """The keys ``actor`` may see: every key for an operator, else their teams' keys."""
    keys = ApiKey.objects.select_related("team", "member")
    if acts_for_fleet(actor):
        return keys.all()
    return keys.filter(team__in=teams_of(actor))


def may_manage_key(actor: Actor, key: ApiKey) -> bool:
    """A lead manages the team's keys; a member their own; operators every key."""
    if has_role(actor, key.team, Membership.Role.LEAD):
        return True
    return (
        key.member_id is not None
        and key.member_id == getattr(actor, "pk", None)
        and has_role(actor, key.team, Membership.Role.MEMBER)
    )


def within_cap(team: Team, limits: dict[str, int | None], who: str) -> None:
    """A member's key asks no more than the team's cap per key: refuse what it exceeds
    (a limit left unset is the cap's)."""
    cap = key_cap(team)
    over = [
        f"{name}: {value} is over team {team.name}'s cap of {getattr(cap, name)} per key"
        for name, value in limits.items()
        if getattr(cap, name) is not None and value is not None and value > getattr(cap, name)
    ]
    if over:
        raise TeamRefused(f"{over[0]}; {who} may ask for at most the cap (its lead may raise it)")


def member_for_new_key(actor: Actor, team: Team, member: Any, limits: dict[str, int | None]) -> Any:
    """Who a key ``actor`` makes in ``team`` is for: a lead (or an operator) names anyone or
    no one; a member's keys are their own, within the team's cap; a viewer makes none
    (RoleRequired). The REST API and the team page both ask here."""
    require_role(actor, team, Membership.Role.MEMBER, "making a key")
    if has_role(actor, team, Membership.Role.LEAD):
        return member
    within_cap(team, limits, recorded_as(actor)[1])
    return actor


def names(teams: Iterable[Team]) -> list[str]:
    return sorted(team.name for team in teams)
