"""Cross-origin answers for browser clients, only for the origins an operator named.

With ``LLMGW_ROUTER_CORS_ORIGINS`` unset the router sends no CORS header at all (and
strips the engines' own, see ``wire.connection.HOP_RESPONSE_HEADERS``): a browser page
on another origin is then refused by the browser, which is the safe default for a
service that spends money per request. Named origins get their own origin back, never ``*``
with credentials; ``*`` allows any origin, for a public playground.
"""

from __future__ import annotations

ALLOWED_METHODS = b"GET, POST, DELETE, OPTIONS"
# What a browser script may read of an answer besides the simple headers.
EXPOSED_HEADERS = (
    b"x-request-id, retry-after, x-ratelimit-limit-requests, x-ratelimit-remaining-requests, "
    b"x-ratelimit-reset-requests, x-ratelimit-limit-tokens, x-ratelimit-remaining-tokens, "
    b"x-ratelimit-reset-tokens"
)
# What a browser may ask for when it sends no Access-Control-Request-Headers.
DEFAULT_REQUEST_HEADERS = b"authorization, content-type, x-api-key, x-request-id, x-session-id"
PREFLIGHT_MAX_AGE = b"600"


class Cors:
    """The origins allowed, and the headers each answer or preflight gets."""

    def __init__(self, origins: tuple[str, ...]) -> None:
        self.any_origin = "*" in origins
        self.origins = frozenset(origin.encode() for origin in origins if origin != "*")

    @property
    def enabled(self) -> bool:
        return self.any_origin or bool(self.origins)

    def allowed(self, origin: bytes | None) -> bytes | None:
        """The Access-Control-Allow-Origin value for ``origin``, or None: not allowed."""
        if origin is None:
            return None
        if self.any_origin:
            return b"*"
        return origin if origin.rstrip(b"/") in self.origins else None

    def headers(self, origin: bytes | None) -> list[tuple[bytes, bytes]]:
        """The CORS headers of an answer to a request from ``origin`` (none if not allowed)."""
        allowed = self.allowed(origin)
        if allowed is None:
            return []
        headers = [
            (b"access-control-allow-origin", allowed),
            (b"access-control-expose-headers", EXPOSED_HEADERS),
        ]
        if allowed != b"*":
            headers.append((b"vary", b"origin"))
        return headers

    def preflight(
        self, origin: bytes | None, requested_headers: bytes | None
    ) -> list[tuple[bytes, bytes]] | None:
        """The extra headers of a preflight's answer, or None when it is refused."""
        if self.allowed(origin) is None:
            return None
        return [
            (b"access-control-allow-methods", ALLOWED_METHODS),
            (b"access-control-allow-headers", requested_headers or DEFAULT_REQUEST_HEADERS),
            (b"access-control-max-age", PREFLIGHT_MAX_AGE),
        ]
