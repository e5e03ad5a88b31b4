"""``llmgw_ctl usage``: requests and tokens per key and model per day, or per team (with
what owned hardware cost each team: router/usage/cost.py)."""

from __future__ import annotations

from decimal import Decimal

from django.core.management.base import CommandError
from django.utils import timezone

from core.tables import render_json, render_table
from protocol.units import parse_duration
from router.usage.cost import team_costs
from router.usage.report import daily_usage, since_days, team_usage


def add_parsers(subparsers) -> None:
    usage = subparsers.add_parser("usage", help="requests and tokens per key and day, or per team")
    usage.add_argument("--key", default="", help="one key, by name or prefix")
    usage.add_argument("--since", default="7d", help="this many days back, today included (7d)")
    usage.add_argument(
        "--by", choices=["key", "team"], default="key", help="per key, model and day, or per team"
    )
    usage.add_argument(
        "--cost", action="store_true", help="with --by team: node-seconds and their cost"
    )
    usage.add_argument("--json", action="store_true")
    usage.set_defaults(handler=usage_command)


def usage_command(options, out) -> None:
    try:
        days = max(1, -(-parse_duration(options["since"]) // 86400))
    except ValueError as exc:
        raise CommandError(f"--since: {exc}") from None
    now = timezone.now()
    since = since_days(days, now)
    if options["cost"] and options["by"] != "team":
        raise CommandError("--cost goes with --by team")
    if options["by"] == "team":
        if options["key"]:
            raise CommandError("--key goes with --by key")
        (cost_command if options["cost"] else team_command)(since, now, days, options, out)
        return
    rows = daily_usage(since, options["key"])
    if options["json"]:
        out.write(render_json([
            {"day": r.day.isoformat(), "key": r.key_name, "prefix": r.key_prefix,
             "model": r.model, "requests": r.requests, "prompt_tokens": r.prompt_tokens,
             "completion_tokens": r.completion_tokens,
             "cached_prompt_tokens": r.cached_prompt_tokens}
            for r in rows
        ]))  # fmt: skip
        return
    if not rows:
        out.write(f"no usage in the last {days} day(s)" + (
            f" for key {options['key']}" if options["key"] else ""))  # fmt: skip
        return
    table = [
        [r.day.isoformat(), r.key_name or "anonymous", r.key_prefix, r.model, str(r.requests),
         str(r.prompt_tokens), str(r.cached_prompt_tokens), str(r.completion_tokens),
         str(r.tokens)]
        for r in rows
    ]  # fmt: skip
    out.write(render_table(
        ["DAY", "KEY", "PREFIX", "MODEL", "REQUESTS", "PROMPT", "OF IT CACHED", "COMPLETION",
         "TOKENS"], table
    ))  # fmt: skip


def team_command(since, now, days: int, options, out) -> None:
    rows = team_usage(since, now)
    if options["json"]:
        out.write(render_json([
            {"team": r.team, "requests": r.requests, "prompt_tokens": r.prompt_tokens,
             "completion_tokens": r.completion_tokens, "tokens": r.tokens}
            for r in rows
        ]))  # fmt: skip
        return
    if not rows:
        out.write(f"no usage in the last {days} day(s)")
        return
    out.write(render_table(
        ["TEAM", "REQUESTS", "PROMPT", "COMPLETION", "TOKENS"],
        [[r.team, str(r.requests), str(r.prompt_tokens), str(r.completion_tokens),
          str(r.tokens)] for r in rows],
    ))  # fmt: skip


def cost_command(since, now, days: int, options, out) -> None:
    report = team_costs(since, now)
    if options["json"]:
        out.write(render_json({
            "since": since.isoformat(), "until": now.isoformat(),
            "gpu_hour": str(report.prices.gpu_hour),
            "cpu_core_hour": str(report.prices.cpu_core_hour),
            "fleet": str(report.fleet), "adds_up": report.adds_up,
            "teams": [
                {"team": t.team, "tokens": t.tokens, "gpu_seconds": t.gpu_seconds,
                 "core_seconds": t.core_seconds, "served": str(t.served), "idle": str(t.idle),
                 "cost": str(t.cost)}
                for t in report.teams
            ],
        }))  # fmt: skip
        return
    table = [
        [t.team, str(t.tokens), str(t.gpu_seconds), str(t.core_seconds), str(t.served),
         str(t.idle), str(t.cost)]
        for t in report.teams
    ]  # fmt: skip
    out.write(render_table(
        ["TEAM", "TOKENS", "GPU-SECONDS", "CORE-SECONDS", "SERVED", "IDLE", "COST"], table
    ))  # fmt: skip
    total = sum((t.cost for t in report.teams), Decimal(0))
    out.write(
        f"\nthe last {days} day(s): the teams' costs add up to {total}, the fleet's cost "
        f"{report.fleet} ({'equal' if report.adds_up else 'NOT EQUAL'})"
    )
    if report.prices.unset:
        out.write(
            "\nno prices set: LLMGW_COST_PER_GPU_HOUR and LLMGW_COST_PER_CPU_CORE_HOUR are 0, "
            'so every cost reads 0 (docs/teams.md, "Cost")'
        )
