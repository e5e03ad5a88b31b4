"""Usage per key and model per day (and per team), read from the hourly rows routers write."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime, timedelta

from django.db.models import Q, Sum
from django.db.models.functions import TruncDate

from catalog.models import ApiKey, Team
from router.models import Usage


class Spent:
    """What a usage total spent, prompt and completion together (the subclasses' fields)."""

    prompt_tokens: int
    completion_tokens: int

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class DailyUsage(Spent):
    day: date
    key_name: str
    key_prefix: str
    model: str
    requests: int
    prompt_tokens: int  # the whole prompt, its cached part included
    completion_tokens: int
    cached_prompt_tokens: int  # of prompt_tokens, read from the engine's prompt cache


def daily_usage(since: datetime, key: str = "") -> list[DailyUsage]:
    """Totals per UTC day, key and model from ``since`` on, newest day first; ``key`` is a
    key's name or prefix (or the whole key)."""
    rows = Usage.objects.filter(hour__gte=since)
    if key:
        rows = rows.filter(Q(key_name=key) | Q(key_prefix=key[:16]))
    totals = (
        rows.annotate(day=TruncDate("hour"))
        .values("day", "key_name", "key_prefix", "model")
        .annotate(
            requests=Sum("requests"),
            prompt_tokens=Sum("prompt_tokens"),
            completion_tokens=Sum("completion_tokens"),
            cached_prompt_tokens=Sum("cached_prompt_tokens"),
        )
        .order_by("-day", "key_name", "model")
    )
    return [DailyUsage(**row) for row in totals]


def since_days(days: int, now: datetime) -> datetime:
    """The start of the UTC day ``days - 1`` days before ``now``: 1 is today alone."""
    start = now - timedelta(days=max(days, 1) - 1)
    return start.replace(hour=0, minute=0, second=0, microsecond=0)


UNASSIGNED = "unassigned"  # usage without a key, or by a key deleted since: no team to name


@dataclass(frozen=True)
class TeamUsage(Spent):
    team: str
    requests: int
    prompt_tokens: int
    completion_tokens: int


def key_teams() -> dict[str, str]:
    """Each key's team by the key's prefix: usage rows name keys by prefix, not by row."""
    return dict(ApiKey.objects.values_list("prefix", "team__name"))


def team_usage(since: datetime, until: datetime | None = None) -> list[TeamUsage]:
    """Totals per team from ``since`` (to ``until``), most tokens first; a row whose key has
    no team any more (deleted, or no auth) counts as ``unassigned``."""
    rows = Usage.objects.filter(hour__gte=since)
    if until is not None:
        rows = rows.filter(hour__lt=until)
    per_key = rows.values("key_prefix").annotate(
        requests=Sum("requests"),
        prompt_tokens=Sum("prompt_tokens"),
        completion_tokens=Sum("completion_tokens"),
    )
    teams = key_teams()
    totals: dict[str, list[int]] = {}
    for row in per_key:
        team = teams.get(row["key_prefix"], UNASSIGNED)
        sums = totals.setdefault(team, [0, 0, 0])
        sums[0] += row["requests"]
        sums[1] += row["prompt_tokens"]
        sums[2] += row["completion_tokens"]
    found = [TeamUsage(team, *sums) for team, sums in totals.items()]
    return sorted(found, key=lambda t: (-t.tokens, t.team))


@dataclass(frozen=True)
class ModelUsage(Spent):
    model: str
    requests: int
    prompt_tokens: int
    completion_tokens: int


def team_model_usage(team: Team, since: datetime) -> list[ModelUsage]:
    """What the team's keys (revoked ones too) spent on each model from ``since`` on,
    most requested first."""
    prefixes = ApiKey.objects.filter(team=team).values("prefix")
    totals = (
        Usage.objects.filter(hour__gte=since, key_prefix__in=prefixes)
        .values("model")
        .annotate(
            requests=Sum("requests"),
            prompt_tokens=Sum("prompt_tokens"),
            completion_tokens=Sum("completion_tokens"),
        )
        .order_by("-requests", "model")
    )
    return [ModelUsage(**row) for row in totals]


def last_day(now: datetime) -> datetime:
    """The start of the 24 hourly rows that end with the current hour's."""
    return now.replace(minute=0, second=0, microsecond=0) - timedelta(hours=23)
