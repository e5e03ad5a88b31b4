"""``llmgw_ctl keys``: create, list and revoke the API keys clients send to ``/v1``."""

from __future__ import annotations

from django.core.management.base import CommandError

from catalog.actions import create_key, revoke_key
from catalog.keys import ApiKeyRefused
from catalog.models import ApiKey
from core.tables import render_json, render_table


def add_parsers(subparsers) -> None:
    keys = subparsers.add_parser("keys", help="create, list and revoke API keys for /v1")
    verbs = keys.add_subparsers(dest="keys_verb", required=True, metavar="VERB")

    create = verbs.add_parser("create", help="create a key and print it (shown only once)")
    create.add_argument("name", help="who or what uses the key")
    create.add_argument(
        "--models", default="", help="comma-separated models the key may use (default: all)"
    )
    create.set_defaults(handler=create_command)

    listing = verbs.add_parser("list", help="list keys: name, prefix, models, revoked")
    listing.add_argument("--json", action="store_true")
    listing.set_defaults(handler=list_command)

    revoke = verbs.add_parser("revoke", help="revoke a key by its prefix")
    revoke.add_argument("prefix", help="the prefix `keys list` shows (or the whole key)")
    revoke.set_defaults(handler=revoke_command)


def create_command(options, out) -> None:
    try:
        row, key = create_key(options["name"], options["models"].split(","))
    except ApiKeyRefused as exc:
        raise CommandError(str(exc)) from None
    out.write(key)
    models = ", ".join(row.allowed_models) or "all models"
    out.write(f"created key {row.prefix}… for {row.name} ({models}); it is not shown again")


def list_command(options, out) -> None:
    rows = list(ApiKey.objects.all())
    if options["json"]:
        out.write(
            render_json(
                [
                    {
                        "name": r.name,
                        "prefix": r.prefix,
                        "models": r.allowed_models,
                        "created_at": r.created_at,
                        "revoked_at": r.revoked_at,
                    }
                    for r in rows
                ]
            )
        )
        return
    table = [
        [
            r.name,
            r.prefix,
            ",".join(r.allowed_models) or "all",
            r.created_at.strftime("%Y-%m-%d %H:%M"),
            r.revoked_at.strftime("%Y-%m-%d %H:%M") if r.revoked_at else "",
        ]
        for r in rows
    ]
    out.write(render_table(["NAME", "PREFIX", "MODELS", "CREATED", "REVOKED"], table))


def revoke_command(options, out) -> None:
    try:
        row = revoke_key(options["prefix"])
    except ApiKeyRefused as exc:
        raise CommandError(str(exc)) from None
    out.write(f"revoked key {row.prefix}… ({row.name})")
