"""The API keys clients send to ``/v1``: how they are drawn and stored, and what routers
load. Creating and revoking one are verbs in ``catalog.actions``.

A key is 32 random bytes, so a single SHA-256 is enough to store it (a slow password
hash protects guessable secrets; this one cannot be guessed), and the router can check
a key with one hash and a dictionary lookup on every request.
"""

from __future__ import annotations

import hashlib
from typing import Any

from catalog.models import ApiKey, Model

KEY_START = "llmgw-"
# "llmgw-" and 8 random characters: enough to tell keys apart in a list, never to use one.
PREFIX_LENGTH = len(KEY_START) + 8


class ApiKeyRefused(Exception):
    """A key verb refused, with a message that names the key or model and the fix."""


def hash_key(key: str) -> str:
    """The stored form of a key (hex SHA-256)."""
    return hashlib.sha256(key.encode()).hexdigest()


def key_prefix(key: str) -> str:
    return key[:PREFIX_LENGTH]


def active_keys() -> list[dict[str, Any]]:
    """Every key that is not revoked, as the router caches it (hashes, never keys)."""
    return [
        {"name": name, "prefix": prefix, "sha256": hashed, "models": list(models)}
        for name, prefix, hashed, models in ApiKey.objects.filter(
            revoked_at__isnull=True
        ).values_list("name", "prefix", "hashed_key", "allowed_models")
    ]


def known_model_names() -> set[str]:
    names: set[str] = set()
    for name, aliases in Model.objects.values_list("name", "aliases"):
        names.add(name)
        names.update(aliases)
    return names
