"""Verbs on REST API tokens: issue one to an account (shown once), revoke one."""

from __future__ import annotations

import secrets
from datetime import timedelta

from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction
from django.utils import timezone

from audit.actors import Actor
from audit.events import record_event
from audit.models import EventKind
from catalog.models import ApiToken
from catalog.tokens.stored import TOKEN_START, ApiTokenRefused, hash_token, token_prefix


def issue_api_token(username: str, *, lifetime: timedelta, actor: Actor) -> tuple[ApiToken, str]:
    """Issue ``username`` a token that expires ``lifetime`` from now; return the row and
    the token, which is never shown again."""
    user = get_user_model().objects.filter(username=username.strip()).first()
    if user is None:
        raise ApiTokenRefused(
            f"no account named {username.strip()!r}; create it first "
            "(`manage.py createsuperuser`, or the admin's Users page)"
        )
    if lifetime <= timedelta(0):
        raise ApiTokenRefused("expires: the token would be expired already; give a lifetime")
    for _attempt in range(5):
        token = TOKEN_START + secrets.token_urlsafe(32)
        try:
            with transaction.atomic():
                row = ApiToken.objects.create(
                    user=user, prefix=token_prefix(token), hashed_token=hash_token(token),
                    expires_at=timezone.now() + lifetime,
                )  # fmt: skip
                record_event(
                    EventKind.KEY, row.prefix,
                    f"API token issued to {user} (expires {row.expires_at:%Y-%m-%d %H:%M} UTC)",
                    actor=actor,
                )  # fmt: skip
        except IntegrityError:
            continue  # two tokens drew the same prefix; draw again
        return row, token
    raise ApiTokenRefused("could not draw a unique token prefix; try again")


def revoke_api_token(prefix: str, *, actor: Actor) -> ApiToken:
    """Revoke the token with this prefix (or this whole token); refused from now on."""
    prefix = token_prefix(prefix.strip())
    with transaction.atomic():
        row = ApiToken.objects.select_for_update().filter(prefix=prefix).first()
        if row is None:
            raise ApiTokenRefused(
                f"no API token with prefix {prefix!r}; `llmgw_ctl api-tokens list` shows them"
            )
        if row.revoked_at is None:
            row.revoked_at = timezone.now()
            row.save(update_fields=["revoked_at"])
            record_event(EventKind.KEY, row.prefix, f"API token of {row.user} revoked",
                         actor=actor)  # fmt: skip
    return row
