"""``llmgw_ctl usage``: requests and tokens per key and model per day."""

from __future__ import annotations

from django.core.management.base import CommandError
from django.utils import timezone

from core.tables import render_json, render_table
from protocol.units import parse_duration
from router.usage.report import daily_usage, since_days


def add_parsers(subparsers) -> None:
    usage = subparsers.add_parser("usage", help="requests and tokens per key and model per day")
    usage.add_argument("--key", default="", help="one key, by name or prefix")
    usage.add_argument("--since", default="7d", help="this many days back, today included (7d)")
    usage.add_argument("--json", action="store_true")
    usage.set_defaults(handler=usage_command)


def usage_command(options, out) -> None:
    try:
        days = max(1, -(-parse_duration(options["since"]) // 86400))
    except ValueError as exc:
        raise CommandError(f"--since: {exc}") from None
    rows = daily_usage(since_days(days, timezone.now()), options["key"])
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
