"""Verbs for the API keys clients send to ``/v1``: create, revoke, and what routers load.

A key is 32 random bytes, so a single SHA-256 is enough to store it (a slow password
hash protects guessable secrets; this one cannot be guessed), and the router can check
a key with one hash and a dictionary lookup on every request.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterable
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from catalog.models import ApiKey, Model
from fleet.routing_table import publish_routing_change

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


def create_key(name: str, allowed_models: Iterable[str] = ()) -> tuple[ApiKey, str]:
    """Create a key for ``name``; return the row and the key, which is never shown again.

    ``allowed_models`` limits the key to those models (names or aliases); empty allows
    every model. Names the catalog does not know are refused, so a typo cannot leave a
    key that silently works for nothing.
    """
    name = name.strip()
    if not name:
        raise ApiKeyRefused("a key needs a name saying who or what uses it")
    allowed = sorted({m.strip() for m in allowed_models if m.strip()})
    unknown = sorted(set(allowed) - _known_model_names())
    if unknown:
        known = ", ".join(sorted(_known_model_names())) or "none"
        raise ApiKeyRefused(
            f"unknown model(s) {', '.join(unknown)}; the catalog has: {known}. "
            "Apply the model first, or fix the name."
        )
    for _attempt in range(5):
        key = KEY_START + secrets.token_urlsafe(32)
        try:
            with transaction.atomic():
                row = ApiKey.objects.create(
                    name=name,
                    prefix=key_prefix(key),
                    hashed_key=hash_key(key),
                    allowed_models=allowed,
                )
                transaction.on_commit(lambda: publish_routing_change("keys"))
        except IntegrityError:
            continue  # two keys drew the same prefix; draw again
        return row, key
    raise ApiKeyRefused("could not draw a unique key prefix; try again")


def revoke_key(prefix: str) -> ApiKey:
    """Revoke the key with this prefix (or this whole key); routers refuse it within a second."""
    prefix = key_prefix(prefix.strip())
    with transaction.atomic():
        row = ApiKey.objects.select_for_update().filter(prefix=prefix).first()
        if row is None:
            raise ApiKeyRefused(f"no key with prefix {prefix!r}; `llmgw_ctl keys list` shows them")
        if row.revoked_at is None:
            row.revoked_at = timezone.now()
            row.save(update_fields=["revoked_at"])
            transaction.on_commit(lambda: publish_routing_change("keys"))
    return row


def active_keys() -> list[dict[str, Any]]:
    """Every key that is not revoked, as the router caches it (hashes, never keys)."""
    return [
        {"name": name, "prefix": prefix, "sha256": hashed, "models": list(models)}
        for name, prefix, hashed, models in ApiKey.objects.filter(
            revoked_at__isnull=True
        ).values_list("name", "prefix", "hashed_key", "allowed_models")
    ]


def _known_model_names() -> set[str]:
    names: set[str] = set()
    for name, aliases in Model.objects.values_list("name", "aliases"):
        names.add(name)
        names.update(aliases)
    return names
