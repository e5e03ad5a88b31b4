"""Tokens for the REST API (``/api/v1/``): how they are drawn, stored and checked.

Like the ``/v1`` keys (``catalog.keys``), a token is 32 random bytes, stored only as its
SHA-256 (it cannot be guessed, so a slow hash would protect nothing), with a prefix to
tell tokens apart in a list, and an expiry. Clients send it as DRF's own tokens were sent,
``Authorization: Token <token>``; the tokens DRF kept in plaintext were moved here, hashed,
by the migration that made this table (``catalog/migrations/0008_hashed_api_tokens.py``).
Issuing and revoking one are verbs in ``catalog.tokens.actions``.
"""

from __future__ import annotations

import hashlib

from django.utils import timezone
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.plumbing import build_bearer_security_scheme_object
from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication, get_authorization_header

from catalog.models import ApiToken

TOKEN_START = "llmgwt-"  # noqa: S105 (how a token begins, not a token)
# "llmgwt-" and 8 random characters: enough to tell tokens apart, never to use one.
PREFIX_LENGTH = len(TOKEN_START) + 8
KEYWORD = b"token"


class ApiTokenRefused(Exception):
    """A token verb refused, with a message that names the account or token and the fix."""


def hash_token(token: str) -> str:
    """The stored form of a token (hex SHA-256)."""
    return hashlib.sha256(token.encode()).hexdigest()


def token_prefix(token: str) -> str:
    return token[:PREFIX_LENGTH]


class HashedTokenAuthentication(BaseAuthentication):
    """``Authorization: Token <token>``: the account whose unexpired, unrevoked token it is."""

    def authenticate(self, request):
        words = get_authorization_header(request).split()
        if not words or words[0].lower() != KEYWORD:
            return None  # not ours: session authentication may still know the caller
        if len(words) != 2:
            raise exceptions.AuthenticationFailed(
                "Give the token as `Authorization: Token <token>`, one word after `Token`."
            )
        try:
            token = words[1].decode()
        except UnicodeError:
            raise exceptions.AuthenticationFailed("The token is not text.") from None
        row = ApiToken.objects.select_related("user").filter(hashed_token=hash_token(token)).first()
        if row is None:
            raise exceptions.AuthenticationFailed(
                "Unknown token; `llmgw_ctl api-tokens create USER` issues one."
            )
        if row.revoked_at is not None:
            raise exceptions.AuthenticationFailed(f"Token {row.prefix}… is revoked.")
        if row.expires_at <= timezone.now():
            raise exceptions.AuthenticationFailed(
                f"Token {row.prefix}… expired at {row.expires_at:%Y-%m-%d %H:%M} UTC; "
                "`llmgw_ctl api-tokens create USER` issues a new one."
            )
        if not row.user.is_active:
            raise exceptions.AuthenticationFailed("The token's account is inactive.")
        return row.user, row

    def authenticate_header(self, request) -> str:
        return "Token"


class HashedTokenScheme(OpenApiAuthenticationExtension):
    """The token as the API schema describes it."""

    target_class = HashedTokenAuthentication
    name = "tokenAuth"

    def get_security_definition(self, auto_schema):
        return build_bearer_security_scheme_object(
            header_name="Authorization",
            token_prefix="Token",  # noqa: S106 (a scheme)
        )
