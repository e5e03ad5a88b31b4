"""The provider's endpoints, read from its discovery document rather than configured one
by one: the issuer URL is all an operator copies from the provider.

Read at the first sign-in and kept for an hour per process, so settings start nothing,
a provider down at start-up does not stop the control plane, and a provider that moves
its endpoints or keys is followed without a restart.
"""

from __future__ import annotations

import ipaddress
import threading
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx
from django.conf import settings

from core.http import outbound_client

DISCOVERY_PATH = "/.well-known/openid-configuration"
# Long enough that sign-ins do not each cost a call to the provider, short enough that
# a provider's new endpoints are picked up within the hour.
KEEP_FOR = 3600.0


class ProviderUnavailable(Exception):
    """The provider's discovery document could not be read or does not describe it."""


@dataclass(frozen=True)
class ProviderEndpoints:
    issuer: str
    authorization_endpoint: str
    token_endpoint: str
    userinfo_endpoint: str
    jwks_uri: str


_lock = threading.Lock()
_known: dict[str, tuple[float, ProviderEndpoints]] = {}


def configured() -> bool:
    return bool(settings.OIDC_ISSUER)


def endpoints() -> ProviderEndpoints:
    """The configured provider's endpoints, read again when an hour old."""
    issuer = settings.OIDC_ISSUER
    with _lock:
        found = _known.get(issuer)
    if found is not None and time.monotonic() - found[0] < KEEP_FOR:
        return found[1]
    read = discover(issuer)
    with _lock:
        _known[issuer] = (time.monotonic(), read)
    return read


def forget() -> None:
    """Read the discovery document again at the next sign-in (tests, a changed issuer)."""
    with _lock:
        _known.clear()


def discover(issuer: str) -> ProviderEndpoints:
    """Read ``issuer``'s discovery document (OpenID Connect Discovery 1.0, section 4)."""
    _refuse_plain_http(issuer)
    url = issuer + DISCOVERY_PATH
    try:
        with outbound_client(issuer, timeout=settings.OIDC_TIMEOUT) as client:
            response = client.get(url)
            response.raise_for_status()
            document = response.json()
    except (httpx.HTTPError, ValueError) as exc:
        raise ProviderUnavailable(f"cannot read {url}: {exc}") from exc
    # Section 4.3: the document must name the issuer it was asked for, or what it lists
    # is some other provider's (a proxy's, a typo's), and tokens it issues would not match.
    if not isinstance(document, dict) or document.get("issuer") != issuer:
        named = document.get("issuer") if isinstance(document, dict) else None
        raise ProviderUnavailable(
            f"{url} names the issuer {named!r}, not {issuer!r}: set LLMGW_OIDC_ISSUER to "
            "exactly what the provider calls itself"
        )
    fields = ("authorization_endpoint", "token_endpoint", "userinfo_endpoint", "jwks_uri")
    missing = [field for field in fields if not document.get(field)]
    if missing:
        raise ProviderUnavailable(f"{url} lists no {', '.join(missing)}")
    return ProviderEndpoints(issuer, *(str(document[field]) for field in fields))


def _refuse_plain_http(issuer: str) -> None:
    # Plain http lets anyone on the way swap the provider's keys; only a provider on this
    # machine's loopback (a trial, the tests) may use it.
    parts = urlsplit(issuer)
    if parts.scheme == "https":
        return
    host = parts.hostname or ""
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if parts.scheme != "http" or not loopback:
        raise ProviderUnavailable(
            f"LLMGW_OIDC_ISSUER={issuer!r} is not https: only a provider on loopback may "
            "be reached over plain http"
        )
