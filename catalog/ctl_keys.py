"""``llmgw_ctl keys``: create, list, show, update and revoke the API keys clients send to
``/v1``, with the limits the routers enforce for each."""

from __future__ import annotations

import time
from datetime import datetime, timedelta

import redis
from django.contrib.auth import get_user_model
from django.core.management.base import CommandError
from django.utils import timezone

from audit.actors import shell_operator
from catalog.actions.api_keys import UNCHANGED, create_key, revoke_key, update_key
from catalog.keys import (
    LIMIT_FIELDS,
    LIMIT_FLAGS,
    PRIORITIES,
    ApiKeyRefused,
    enforced_limits,
    find_key,
    key_limits,
    key_usage,
    usage_rows,
)
from catalog.models import ApiKey
from core.tables import render_json, render_table
from protocol.units import parse_duration


def add_parsers(subparsers) -> None:
    keys = subparsers.add_parser("keys", help="create, list, show, update and revoke API keys")
    verbs = keys.add_subparsers(dest="keys_verb", required=True, metavar="VERB")

    create = verbs.add_parser("create", help="create a key and print it (shown only once)")
    create.add_argument("name", help="who or what uses the key")
    create.add_argument(
        "--models", default="", help="comma-separated models the key may use (default: all)"
    )
    create.add_argument("--team", help="the team it spends for (default: default)")
    create.add_argument("--member", help="the team member it is for (their username)")
    _add_terms(create)
    create.set_defaults(handler=create_command)

    update = verbs.add_parser("update", help="change a key's models, limits, expiry or priority")
    update.add_argument("key", help="the key's prefix (or the whole key), or its name")
    update.add_argument("--models", help="comma-separated models; an empty string: all")
    _add_terms(update, clearing=True)
    update.set_defaults(handler=update_command)

    listing = verbs.add_parser("list", help="list keys: name, prefix, models, limits, revoked")
    listing.add_argument("--json", action="store_true")
    listing.set_defaults(handler=list_command)

    show = verbs.add_parser("show", help="a key's limits and what it used of each")
    show.add_argument("key", help="the key's prefix (or the whole key), or its name")
    show.add_argument("--json", action="store_true")
    show.set_defaults(handler=show_command)

    revoke = verbs.add_parser("revoke", help="revoke a key by its prefix")
    revoke.add_argument("prefix", help="the prefix `keys list` shows (or the whole key)")
    revoke.set_defaults(handler=revoke_command)


def _add_terms(parser, clearing: bool = False) -> None:
    extra = "; none clears it" if clearing else ""
    for flag, field, counts in LIMIT_FLAGS:
        parser.add_argument(flag, dest=field, metavar="N", help=f"at most N {counts}{extra}")
    parser.add_argument(
        "--expires", metavar="AFTER", help=f"refuse the key after this long (30d, 12h){extra}"
    )
    parser.add_argument("--priority", choices=PRIORITIES, help="served first when busy: high")


def _limits(options) -> dict[str, int | None]:
    """The limit flags given, as numbers (None for `none`); a bad one names its flag."""
    limits: dict[str, int | None] = {}
    for flag, field, _counts in LIMIT_FLAGS:
        value = options.get(field)
        if value is None:
            continue
        if value.strip().lower() == "none":
            limits[field] = None
            continue
        try:
            limits[field] = int(value)
        except ValueError:
            raise CommandError(f"{flag} {value!r}: give a whole number, or none") from None
    return limits


def _expiry(value: str | None) -> datetime | None:
    if value is None or value.strip().lower() == "none":
        return None
    try:
        return timezone.now() + timedelta(seconds=parse_duration(value))
    except ValueError as exc:
        raise CommandError(f"--expires: {exc}") from None


def create_command(options, out) -> None:
    try:
        row, key = create_key(
            options["name"],
            options["models"].split(","),
            limits=_limits(options),
            expires_at=_expiry(options.get("expires")),
            priority=options.get("priority") or "normal",
            team=options.get("team"),
            member=_member(options.get("member")),
            actor=shell_operator(),
        )
    except ApiKeyRefused as exc:
        raise CommandError(str(exc)) from None
    out.write(key)
    models = ", ".join(row.allowed_models) or "all models"
    out.write(f"created key {row.prefix}… for {row.name} in team {row.team.name} ({models}); "
              "it is not shown again")  # fmt: skip


def _member(username: str | None):
    if not username:
        return None
    user = get_user_model().objects.filter(username=username).first()
    if user is None:
        raise CommandError(f"--member: no account {username!r}")
    return user


def update_command(options, out) -> None:
    models = options.get("models")
    try:
        row = update_key(
            options["key"],
            allowed_models=models.split(",") if models is not None else None,
            limits=_limits(options),
            expires_at=_expiry(options["expires"]) if options.get("expires") else UNCHANGED,
            priority=options.get("priority"),
            actor=shell_operator(),
        )
    except ApiKeyRefused as exc:
        raise CommandError(str(exc)) from None
    out.write(f"key {row.prefix}… ({row.name}): {_describe_limits(row)}")


def list_command(options, out) -> None:
    rows = list(ApiKey.objects.select_related("team"))
    if options["json"]:
        out.write(render_json([_as_json(r) for r in rows]))
        return
    table = [
        [
            r.name,
            r.prefix,
            r.team.name,
            ",".join(r.allowed_models) or "all",
            _describe_limits(r),
            r.created_at.strftime("%Y-%m-%d %H:%M"),
            r.revoked_at.strftime("%Y-%m-%d %H:%M") if r.revoked_at else "",
        ]
        for r in rows
    ]
    out.write(render_table(["NAME", "PREFIX", "TEAM", "MODELS", "LIMITS", "CREATED", "REVOKED"],
                           table))  # fmt: skip


def show_command(options, out) -> None:
    try:
        row = find_key(options["key"])
    except ApiKeyRefused as exc:
        raise CommandError(str(exc)) from None
    try:
        used = key_usage(row, time.time())
    except redis.RedisError as exc:
        raise CommandError(f"cannot read the routers' counters in Redis: {exc}") from None
    limits = enforced_limits(row).as_dict()  # the default cap on requests in flight shown
    if options["json"]:
        usage = {f: {"limit": limits.get(f), "used": used[f]} for f in LIMIT_FIELDS}
        out.write(render_json({**_as_json(row), "usage": usage}))
        return
    out.write(f"key {row.prefix}… ({row.name}), models: {', '.join(row.allowed_models) or 'all'}")
    rows = usage_rows(limits, used)
    out.write(render_table(["LIMIT", "AT MOST", "USED", "SHARE"], rows))
    if row.concurrency is None and "concurrency" in limits:
        out.write("requests in flight: the default cap (LLMGW_KEY_CONCURRENCY); "
                  "`keys update --concurrency N` sets the key's own")  # fmt: skip
    out.write(f"priority: {row.priority}; {_expiry_text(row)}")


def revoke_command(options, out) -> None:
    try:
        row = revoke_key(options["prefix"], actor=shell_operator())
    except ApiKeyRefused as exc:
        raise CommandError(str(exc)) from None
    out.write(f"revoked key {row.prefix}… ({row.name})")


def _as_json(row: ApiKey) -> dict:
    return {
        "name": row.name,
        "prefix": row.prefix,
        "team": row.team.name,
        "models": row.allowed_models,
        "limits": key_limits(row).as_dict(),
        "priority": row.priority,
        "expires_at": row.expires_at,
        "created_at": row.created_at,
        "revoked_at": row.revoked_at,
    }


def _describe_limits(row: ApiKey) -> str:
    short = {"requests_per_minute": "rpm", "tokens_per_minute": "tpm",
             "tokens_per_day": "tokens/day", "tokens_per_month": "tokens/month",
             "concurrency": "concurrent"}  # fmt: skip
    terms = [f"{value} {short[field]}" for field, value in key_limits(row).as_dict().items()]
    if row.priority != "normal":
        terms.append(f"priority {row.priority}")
    if row.expires_at is not None:
        terms.append(f"expires {row.expires_at:%Y-%m-%d}")
    return ", ".join(terms) or "no limits"


def _expiry_text(row: ApiKey) -> str:
    if row.expires_at is None:
        return "never expires"
    verb = "expired" if row.expires_at <= timezone.now() else "expires"
    return f"{verb} {row.expires_at:%Y-%m-%d %H:%M} UTC"
