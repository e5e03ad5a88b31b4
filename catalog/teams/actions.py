"""Verbs on teams: make one, change its budgets and cap per key, give a person a role in it
or take it away, open a model to named teams (or to all). Each records a ``team`` Event
naming who acted and tells routers on commit: a team's budgets, cap and models travel with
its keys in the routers' key table (``catalog.keys.active_keys``).

Who may: operators (and ``llmgw_ctl``) make and change teams and open models; a team's
lead also gives and takes roles in it (``catalog.teams.roles``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from django.contrib.auth import get_user_model
from django.db import transaction

from audit import notices
from audit.actors import Actor
from audit.events import record_event
from audit.models import EventKind
from catalog.keys import check_limits, team_limits
from catalog.models import Membership, Model, Team
from catalog.teams.roles import (
    DEFAULT_TEAM,
    ROLES,
    RoleRequired,
    TeamRefused,
    acts_for_fleet,
    check_key_cap,
    find_team,
    key_cap,
    require_role,
)  # fmt: skip
from core.humanize import no_such

TEAM_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,63}$")


def create_team(
    name: str, *, description: str = "", limits: dict[str, int | None] | None = None,
    key_cap: dict[str, int | None] | None = None, actor: Actor,
) -> Team:  # fmt: skip
    """Make a team with these budgets (all its keys together) and cap per key."""
    _operators_only(actor, f"making team {name}")
    name = name.strip()
    if not TEAM_NAME.match(name):
        raise TeamRefused(
            f"team name {name!r}: use lowercase letters, digits and dashes (platform-ml)"
        )
    checked, cap = check_limits(limits or {}), check_key_cap(key_cap or {})
    with transaction.atomic():
        if Team.objects.filter(name=name).exists():
            raise TeamRefused(f"team {name} exists already; `llmgw_ctl teams update` changes it")
        team = Team.objects.create(name=name, description=description, key_cap=cap, **checked)
        record_event(EventKind.TEAM, name, f"created{_terms(team)}", actor=actor)
        notices.routers_reload_on_commit("keys")
    return team


def update_team(
    name: str, *, description: str | None = None, limits: dict[str, int | None] | None = None,
    key_cap: dict[str, int | None] | None = None, actor: Actor,
) -> Team:  # fmt: skip
    """Change a team's budgets (None clears one), cap per key (merged: None drops a field)
    or description; routers hold its keys to them within a second."""
    _operators_only(actor, f"changing team {name}'s budgets")
    checked = check_limits(limits or {})
    cap_changes = check_limits(key_cap or {})
    with transaction.atomic():
        team = Team.objects.select_for_update().get(id=find_team(name).id)
        changes: dict[str, Any] = dict(checked)
        if description is not None:
            changes["description"] = description
        if cap_changes:
            cap = {**team.key_cap, **cap_changes}
            changes["key_cap"] = {k: v for k, v in cap.items() if v is not None}
        changed = [field for field, value in changes.items() if getattr(team, field) != value]
        if changed:
            for field in changed:
                setattr(team, field, changes[field])
            team.save(update_fields=changed)
            record_event(
                EventKind.TEAM, team.name, f"updated {', '.join(changed)}{_terms(team)}",
                actor=actor,
            )  # fmt: skip
            notices.routers_reload_on_commit("keys")
    return team


def delete_team(name: str, *, actor: Actor) -> None:
    """Remove a team that holds no keys (revoked ones included: its usage names them)."""
    _operators_only(actor, f"removing team {name}")
    with transaction.atomic():
        team = Team.objects.select_for_update().get(id=find_team(name).id)
        if team.name == DEFAULT_TEAM:
            raise TeamRefused("team default holds the keys no other team does; it stays")
        held = team.api_keys.count()
        if held:
            raise TeamRefused(
                f"team {team.name} holds {held} key(s); move or revoke them first "
                "(revoked keys stay for its usage: such a team stays too)"
            )
        team.delete()
        record_event(EventKind.TEAM, name, "removed", actor=actor)
        notices.routers_reload_on_commit("keys")


def set_role(team_name: str, username: str, role: str, *, actor: Actor) -> Membership:
    """Give ``username`` ``role`` in the team (adding them, or changing the role they hold).
    A lead may do it in their team; the last lead cannot step down but by an operator."""
    if role not in ROLES:
        raise TeamRefused(f"role {role!r}: one of {', '.join(ROLES)}")
    team = find_team(team_name)
    require_role(actor, team, Membership.Role.LEAD, f"giving {username} a role")
    user = _find_user(username)
    with transaction.atomic():
        Team.objects.select_for_update().filter(id=team.id).first()  # one change at a time
        held = Membership.objects.filter(team=team, user=user).first()
        if held is not None and held.role == role:
            return held
        if held is not None and held.role == Membership.Role.LEAD:
            _keep_a_lead(team, actor, f"{username} stepping down to {role}")
        if held is None:
            held = Membership.objects.create(team=team, user=user, role=role)
            reason = f"{username} joined as {role}"
        else:
            reason = f"{username}'s role changed from {held.role} to {role}"
            held.role = role
            held.save(update_fields=["role"])
        record_event(EventKind.TEAM, team.name, reason, actor=actor)
    return held


def remove_member(team_name: str, username: str, *, actor: Actor) -> None:
    """Take ``username`` out of the team; their keys stay the team's (a lead revokes them)."""
    team = find_team(team_name)
    require_role(actor, team, Membership.Role.LEAD, f"removing {username}")
    user = _find_user(username)
    with transaction.atomic():
        Team.objects.select_for_update().filter(id=team.id).first()
        held = Membership.objects.filter(team=team, user=user).first()
        if held is None:
            raise TeamRefused(f"{username} is not in team {team.name}")
        if held.role == Membership.Role.LEAD:
            _keep_a_lead(team, actor, f"removing lead {username}")
        held.delete()
        record_event(EventKind.TEAM, team.name, f"{username} left (was {held.role})", actor=actor)


def set_provider_team_roles(
    user: Any, wanted: Mapping[str, str], managed: Iterable[str], *, provider: str, actor: Actor
) -> None:
    """Set ``user``'s role in each of the ``managed`` teams (the ones the identity provider's
    role map names) to what its claims give now (``wanted``: team to role), taking them out
    of those the claims no longer name; their roles in other teams are their leads' to give.
    A team the map names that does not exist gives no role, and the Event says so."""
    username = user.get_username()
    with transaction.atomic():
        for name in sorted(set(managed)):
            team = Team.objects.select_for_update().filter(name=name).first()
            role = wanted.get(name)
            if team is None:
                if role is not None:
                    reason = f"{provider} gives {username} {role} in a team that does not exist"
                    record_event(EventKind.TEAM, name, f"{reason}; make it first", actor=actor)
                continue
            held = Membership.objects.filter(team=team, user=user).first()
            if held is None and role is not None:
                Membership.objects.create(team=team, user=user, role=role)
                reason = f"{username} joined as {role} (from {provider})"
            elif held is not None and role is None:
                held.delete()
                reason = f"{username} left (was {held.role}): {provider} no longer says so"
            elif held is not None and role is not None and held.role != role:
                reason = f"{username}'s role changed from {held.role} to {role} (from {provider})"
                held.role = role
                held.save(update_fields=["role"])
            else:
                continue
            record_event(EventKind.TEAM, team.name, reason, actor=actor)


def open_model(model_name: str, team_names: Iterable[str], *, actor: Actor) -> list[str]:
    """Open a model to exactly these teams (none: to every team); the other teams' keys
    get 404 ``model_not_found`` for it and no longer see it in ``/v1/models``."""
    _operators_only(actor, f"opening model {model_name} to teams")
    wanted = sorted({name.strip() for name in team_names if name.strip()})
    teams = [find_team(name) for name in wanted]
    with transaction.atomic():
        model = Model.objects.select_for_update().filter(name=model_name).first()
        if model is None:
            names = list(Model.objects.values_list("name", flat=True))
            raise TeamRefused(no_such("model", model_name, names))
        before = sorted(model.teams.values_list("name", flat=True))
        if before != wanted:
            model.teams.set(teams)
            to = f"teams {', '.join(wanted)}" if wanted else "every team"
            was = ", ".join(before) or "every team"
            record_event(EventKind.TEAM, model.name, f"model opened to {to} (was {was})",
                         actor=actor)  # fmt: skip
            # The keys' table carries what each team may use; pages show the catalog.
            notices.routers_reload_on_commit("keys")
            notices.pages_changed_on_commit("catalog", model.name)
    return wanted


def _operators_only(actor: Actor, doing: str) -> None:
    if not acts_for_fleet(actor):
        raise RoleRequired(f"{doing} is an operator's; ask an admin to add you to 'operators'")


def _keep_a_lead(team: Team, actor: Actor, doing: str) -> None:
    """A team keeps a lead unless an operator says otherwise: else nobody could manage it."""
    leads = Membership.objects.filter(team=team, role=Membership.Role.LEAD).count()
    if leads <= 1 and not acts_for_fleet(actor):
        raise TeamRefused(
            f"{doing} would leave team {team.name} without a lead; make another lead first"
        )


def _find_user(username: str):
    user = get_user_model().objects.filter(username=username).first()
    if user is None:
        raise TeamRefused(f"no account {username!r}; it signs in once, or an admin makes it")
    return user


def _terms(team: Team) -> str:
    """A team's budgets and cap per key in an Event's words; "" when it has none."""
    terms = [f"{v} {k.replace('_', ' ')}" for k, v in team_limits(team).as_dict().items()]
    terms += [f"{v} {k.replace('_', ' ')} per key" for k, v in key_cap(team).as_dict().items()]
    return f": {', '.join(terms)}" if terms else ""
