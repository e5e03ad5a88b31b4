"""The usage page: what each key spent on each model, per day, and what each team spent
and cost (router/usage/cost.py)."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone

from fleet.pages.team_page import readable_team
from router.usage.cost import team_costs
from router.usage.report import daily_usage, last_day, since_days, team_model_usage

DAYS_SHOWN = (1, 7, 30, 90)


@login_required
def usage(request: HttpRequest) -> HttpResponse:
    """Requests and tokens per key and model per day, for the last days chosen."""
    try:
        days = int(request.GET.get("days", 7))
    except ValueError:
        days = 7
    days = days if days in DAYS_SHOWN else 7
    key = request.GET.get("key", "").strip()
    now = timezone.now()
    since = since_days(days, now)
    rows = daily_usage(since, key)
    # The split reads every replica's Events and walks each hour it ran: asked for, not
    # paid on every load of the page.
    costs = team_costs(since, now) if request.GET.get("teams") else None
    teams = costs.teams if costs else []
    most = max((t.cost for t in teams), default=0) or 1
    context = {
        "costs": costs,
        "team_rows": [(t, int(100 * t.cost / most)) for t in teams],
        "teams_sum": sum(t.cost for t in teams),
        "rows": rows,
        "days": days,
        "days_shown": DAYS_SHOWN,
        "key": key,
        "total_requests": sum(r.requests for r in rows),
        "total_tokens": sum(r.tokens for r in rows),
    }
    return render(request, "router/usage.html", context)


@login_required
def team_usage(request: HttpRequest, name: str) -> HttpResponse:
    """A team's requests and tokens per model over the last day: the team page loads it
    (the router's rows are the router's to read); 404 to whoever may not see the team."""
    team = readable_team(request.user, name)
    rows = team_model_usage(team, last_day(timezone.now()))
    context = {
        "team": team,
        "rows": rows,
        "total_requests": sum(r.requests for r in rows),
        "total_tokens": sum(r.tokens for r in rows),
    }
    return render(request, "router/team_usage.html", context)
