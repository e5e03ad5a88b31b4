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


def check_source(value: str) -> str:
    """``value`` if it is a usable source for weights or an adapter; else ValueError
    saying what it is not."""
    if value.startswith("/") or value.startswith("https://") or HUB_ID.match(value):
        return value
    if value.startswith("http://") and is_loopback_url(value):
        return value  # this machine's own server: nothing on the way to read or alter
    if value.startswith("http://"):
        raise ValueError(f"source {value!r} uses plain http; use https://")
    raise ValueError(
        f"source {value!r} is neither an absolute path, an https:// URL nor a hub id like org/repo"
    )
