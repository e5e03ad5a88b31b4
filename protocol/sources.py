"""What a weights source may be, as both the catalog and the agent judge it."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})
# A hub repository ("org/name"): the engines that take one resolve and fetch it themselves.
HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


def is_loopback_url(url: str) -> bool:
    """Say whether a URL names this machine (plain http is allowed only there)."""
    return (urlsplit(url).hostname or "") in LOOPBACK
