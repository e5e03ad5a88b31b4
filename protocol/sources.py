"""What a weights source may be, as both the catalog and the agent judge it."""

from __future__ import annotations

from urllib.parse import urlsplit

LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})


def is_loopback_url(url: str) -> bool:
    """Say whether a URL names this machine (plain http is allowed only there)."""
    return (urlsplit(url).hostname or "") in LOOPBACK
