"""The usage page: what each key spent on each model, per day."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone

from fleet.pages.team_page import readable_team
from router.usage.report import daily_usage, last_day, since_days
from router.usage.report import team_usage as team_usage_rows

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
    rows = daily_usage(since_days(days, timezone.now()), key)
    context = {
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
    rows = team_usage_rows(team, last_day(timezone.now()))
    context = {
        "team": team,
        "rows": rows,
        "total_requests": sum(r.requests for r in rows),
        "total_tokens": sum(r.tokens for r in rows),
    }
    return render(request, "router/team_usage.html", context)
