"""``llmgw_ctl api-tokens``: issue, list and revoke the tokens of the REST API
(``Authorization: Token …`` on ``/api/v1/``), stored hashed, each with an expiry."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.core.management.base import CommandError
from django.utils import timezone

from audit.actors import shell_operator
from catalog.models import ApiToken
from catalog.tokens.actions import issue_api_token, revoke_api_token
from catalog.tokens.stored import ApiTokenRefused
from core.tables import render_table
from protocol.units import parse_duration


def add_parsers(subparsers) -> None:
    tokens = subparsers.add_parser("api-tokens", help="issue, list and revoke REST API tokens")
    verbs = tokens.add_subparsers(dest="tokens_verb", required=True, metavar="VERB")

    create = verbs.add_parser("create", help="issue an account a token and print it (once)")
    create.add_argument("user", help="the account's username")
    create.add_argument(
        "--expires", metavar="AFTER",
        help=f"refuse it after this long (90d, 12h; default {settings.API_TOKEN_LIFETIME_DAYS}d)",
    )  # fmt: skip
    create.set_defaults(handler=create_command)

    listing = verbs.add_parser("list", help="list tokens: account, prefix, expiry, revoked")
    listing.set_defaults(handler=list_command)

    revoke = verbs.add_parser("revoke", help="revoke a token by its prefix")
    revoke.add_argument("prefix", help="the prefix `api-tokens list` shows (or the token)")
    revoke.set_defaults(handler=revoke_command)


def create_command(options, out) -> None:
    lifetime = timedelta(days=settings.API_TOKEN_LIFETIME_DAYS)
    if options.get("expires"):
        try:
            lifetime = timedelta(seconds=parse_duration(options["expires"]))
        except ValueError as exc:
            raise CommandError(f"--expires: {exc}") from None
    try:
        row, token = issue_api_token(options["user"], lifetime=lifetime, actor=shell_operator())
    except ApiTokenRefused as exc:
        raise CommandError(str(exc)) from None
    out.write(token)
    out.write(
        f"issued API token {row.prefix}… to {row.user}, expires "
        f"{row.expires_at:%Y-%m-%d %H:%M} UTC; send it as `Authorization: Token <token>`; "
        "it is not shown again"
    )


def list_command(options, out) -> None:
    now = timezone.now()
    rows = [
        [
            str(r.user),
            r.prefix,
            r.created_at.strftime("%Y-%m-%d %H:%M"),
            r.expires_at.strftime("%Y-%m-%d %H:%M") + (" (expired)" if r.expires_at <= now else ""),
            r.revoked_at.strftime("%Y-%m-%d %H:%M") if r.revoked_at else "",
        ]
        for r in ApiToken.objects.select_related("user")
    ]
    out.write(render_table(["USER", "PREFIX", "CREATED", "EXPIRES", "REVOKED"], rows))


def revoke_command(options, out) -> None:
    try:
        row = revoke_api_token(options["prefix"], actor=shell_operator())
    except ApiTokenRefused as exc:
        raise CommandError(str(exc)) from None
    out.write(f"revoked API token {row.prefix}… of {row.user}")
