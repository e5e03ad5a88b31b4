"""The authentication backend for sign-in through the provider: mozilla-django-oidc's,
with the provider's endpoints from discovery, the checks it leaves out, and accounts
matched by issuer and subject.

Every way a sign-in fails becomes a ``SignInRefused`` with a sentence a person can act
on; the callback view (``fleet.pages.oidc``) shows it and records it.
"""

from __future__ import annotations

import logging
from typing import Any

import jwt
import requests
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.exceptions import ImproperlyConfigured, SuspiciousOperation
from mozilla_django_oidc.auth import OIDCAuthenticationBackend

from audit.actors import PROVIDER_SIGN_IN
from audit.receivers import client_address
from catalog.teams.actions import set_provider_team_roles
from fleet.actions.sign_ins import admit_provider_user
from fleet.oidc import provider
from fleet.oidc.roles import (
    READER,
    claim_values,
    group_roles,
    mapped_teams,
    role_map,
    roles_from_claims,
    team_roles,
)  # fmt: skip

log = logging.getLogger("llmgw.fleet.oidc")

# Where the backend leaves its refusal for the callback view: authenticate() can only say
# None, and Django's authenticate() swallows what a backend raises as PermissionDenied.
REFUSAL_ATTRIBUTE = "llmgw_sign_in_refused"


class SignInRefused(Exception):
    """A sign-in through the provider that must not go on; the message says why."""


class ProviderBackend(OIDCAuthenticationBackend):
    """Signs in the person the provider's verified ID token names."""

    # admit_provider_user records its sign-ins, naming the provider, and its refusals with
    # their reason: audit's receivers, which record every other backend's, leave them be.
    records_sign_ins = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Not the library's __init__: it reads every endpoint from settings at once, and
        # this backend is built for every password sign-in too, which must not wait on the
        # provider. The endpoints are read from discovery when a sign-in needs them.
        self.OIDC_RP_CLIENT_ID = settings.OIDC_RP_CLIENT_ID
        self.OIDC_RP_CLIENT_SECRET = settings.OIDC_RP_CLIENT_SECRET
        self.OIDC_RP_SIGN_ALGO = settings.OIDC_RP_SIGN_ALGO
        self.OIDC_RP_IDP_SIGN_KEY = None
        self.UserModel = get_user_model()

    @property
    def OIDC_OP_TOKEN_ENDPOINT(self) -> str:  # noqa: N802 (the library's name)
        return provider.endpoints().token_endpoint

    @property
    def OIDC_OP_USER_ENDPOINT(self) -> str:  # noqa: N802
        return provider.endpoints().userinfo_endpoint

    @property
    def OIDC_OP_JWKS_ENDPOINT(self) -> str:  # noqa: N802
        return provider.endpoints().jwks_uri

    def get_user(self, user_id):
        """The signed-in user of a session, while active: the library's would keep a user
        an admin disabled signed in until their session ended."""
        user = super().get_user(user_id)
        return user if user is not None and self.user_can_authenticate(user) else None

    def authenticate(self, request, **kwargs):
        """The library's flow, every failure turned into a refusal the page can show."""
        if request is None or "nonce" not in kwargs:
            return None  # a password sign-in (only the callback view passes a nonce): not ours
        try:
            return super().authenticate(request, **kwargs)
        except SignInRefused as exc:
            reason = str(exc)
        except provider.ProviderUnavailable as exc:
            reason = f"the provider cannot be reached: {exc}"
        except requests.RequestException as exc:
            # A code used twice, a wrong client secret, a PKCE verifier that does not match.
            reason = f"the provider refused to complete it ({_short(exc)})"
        except (SuspiciousOperation, jwt.PyJWTError) as exc:
            reason = f"the provider's ID token does not verify ({exc})"
        except ImproperlyConfigured as exc:
            reason = str(exc)
        log.warning("sign-in through the provider refused: %s", reason)
        setattr(request, REFUSAL_ATTRIBUTE, reason)
        return None

    def verify_token(self, token, **kwargs):
        """The library checks the signature, the expiry and the nonce; this adds what it
        leaves out (OpenID Connect Core 3.1.3.7): who issued the token and for whom."""
        if not isinstance(token, str) or not token:
            raise SignInRefused("the provider sent no ID token (is the openid scope asked for?)")
        payload = super().verify_token(token, **kwargs)
        issuer = provider.endpoints().issuer
        if payload.get("iss") != issuer:
            raise SignInRefused(f"the ID token was issued by {payload.get('iss')!r}, not {issuer}")
        audience = payload.get("aud")
        audiences = [audience] if isinstance(audience, str) else list(audience or [])
        client_id = self.OIDC_RP_CLIENT_ID
        if client_id not in audiences or (len(audiences) > 1 and payload.get("azp") != client_id):
            raise SignInRefused(f"the ID token is meant for {audiences}, not this client")
        if "exp" not in payload or not payload.get("sub"):
            raise SignInRefused("the ID token has no expiry or no subject")
        return payload

    def get_or_create_user(self, access_token, id_token, payload):
        """The account of the token's subject at this issuer, with the roles its claims give."""
        userinfo = self.get_userinfo(access_token, id_token, payload)
        if userinfo.get("sub") != payload["sub"]:
            # Core 5.3.2: user info about someone else must not be taken for this person.
            raise SignInRefused("the provider's user info names another subject than its token")
        # The signed token's claims win over the user info's where both say something.
        claims = {**userinfo, **payload}
        mapping = role_map()
        roles = roles_from_claims(claims, mapping)
        if not roles and settings.OIDC_REQUIRE_ROLE:
            values = ", ".join(claim_values(claims)) or "none"
            raise SignInRefused(
                f"your account there holds no role here: its {settings.OIDC_ROLES_CLAIM} claim "
                f"({values}) matches no entry of LLMGW_OIDC_ROLE_MAP; ask an operator"
            )
        user = admit_provider_user(
            provider.endpoints().issuer,
            str(payload["sub"]),
            claims,
            roles - {READER},
            group_roles(),
            provider=settings.OIDC_PROVIDER_NAME,
            address=client_address(self.request),
            actor=PROVIDER_SIGN_IN,
        )
        if not user.is_active:
            raise SignInRefused(f"the account {user.username} is disabled here")
        # Team roles, beside the groups: in the teams the map names, as the claims give now.
        set_provider_team_roles(
            user, team_roles(roles), mapped_teams(mapping),
            provider=settings.OIDC_PROVIDER_NAME, actor=PROVIDER_SIGN_IN,
        )  # fmt: skip
        return user


def _short(exc: Exception) -> str:
    # The library's token error carries the provider's whole answer; its first line will do.
    return str(exc).splitlines()[0][:300]
