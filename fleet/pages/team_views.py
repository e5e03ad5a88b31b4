"""The team pages: ``/teams/`` lists the signed-in person's teams (every team for an
operator); ``/teams/NAME/`` shows one to its members and operators (404 to anyone else).
From it a lead makes and revokes the team's keys, a member their own; a viewer only looks.
Each change is a verb (``catalog.actions.api_keys``), whose role check is the REST API's
(``catalog.teams.roles``); a new key is shown once, in the answer to the POST that made it."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import User
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from catalog.actions.api_keys import create_key, revoke_key
from catalog.keys import LIMIT_FIELDS, ApiKeyRefused
from catalog.models import ApiKey, Membership
from catalog.teams.roles import (
    RoleRequired,
    has_role,
    may_manage_key,
    member_for_new_key,
    role_in,
    teams_of,
)  # fmt: skip
from fleet.pages.team_page import readable_team, team_context


@login_required
def teams(request: HttpRequest) -> HttpResponse:
    rows = [
        {"team": team, "role": role_in(request.user, team),
         "members": team.memberships.count(), "keys": team.api_keys.filter(revoked_at=None).count()}
        for team in teams_of(request.user)
    ]  # fmt: skip
    return render(request, "fleet/teams.html", {"rows": rows})


@login_required
def team(request: HttpRequest, name: str) -> HttpResponse:
    found = readable_team(request.user, name)
    return render(request, "fleet/team.html", team_context(found, request.user))


@login_required
@require_POST
def new_key(request: HttpRequest, name: str) -> HttpResponse:
    """Make a key in the team and show it, this once; a refusal is shown on the page."""
    found = readable_team(request.user, name)
    form = request.POST
    status, extra = 201, {}
    try:
        limits = _limits(form)
        # Only a lead names whom the key is for; a member's keys are their own.
        lead = has_role(request.user, found, Membership.Role.LEAD)
        member = member_for_new_key(request.user, found, _member(found, form) if lead else None,
                                    limits)  # fmt: skip
        row, key = create_key(
            form.get("name", ""), form.getlist("models"), limits=limits,
            team=found, member=member, actor=request.user,
        )  # fmt: skip
        extra = {"new_key": key, "new_row": row}
    except RoleRequired as exc:
        status, extra = 403, {"refusal": str(exc)}
    except ApiKeyRefused as exc:
        status, extra = 400, {"refusal": str(exc), "asked": form}
    context = team_context(found, request.user) | extra
    return render(request, "fleet/team.html", context, status=status)


@login_required
@require_POST
def revoke(request: HttpRequest, name: str, prefix: str) -> HttpResponse:
    found = readable_team(request.user, name)
    key = ApiKey.objects.filter(team=found, prefix=prefix).first()
    if key is None:
        raise Http404(f"team {found.name} has no key {prefix}…")
    if not may_manage_key(request.user, key):
        context = team_context(found, request.user)
        context["refusal"] = (
            f"key {key.prefix}… is team {found.name}'s: its lead revokes it, or the member it "
            "was made for"
        )
        return render(request, "fleet/team.html", context, status=403)
    revoke_key(key.prefix, actor=request.user)
    messages.success(request, f"Revoked {key.name}'s key {key.prefix}…; routers refuse it now.")
    return redirect("team", found.name)


def _limits(form: Any) -> dict[str, int | None]:
    """The limits the form asks for; an empty field asks for none (the cap's, for a member)."""
    limits: dict[str, int | None] = {}
    for name in LIMIT_FIELDS:
        raw = form.get(name, "").strip()
        if not raw:
            continue
        if not raw.isdigit():
            raise ApiKeyRefused(f"{name.replace('_', ' ')}: {raw!r} is not a whole number")
        limits[name] = int(raw)
    return limits


def _member(team: Any, form: Any) -> User | None:
    """The member a lead makes the key for; none: the team's own key."""
    username = form.get("member", "").strip()
    if not username:
        return None
    held = Membership.objects.filter(team=team, user__username=username).select_related("user")
    membership = held.first()
    if membership is None:
        raise ApiKeyRefused(f"member: {username} is not in team {team.name}")
    return membership.user
