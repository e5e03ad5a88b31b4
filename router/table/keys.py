"""API keys as the router checks them: one SHA-256 and a dictionary lookup, no database.

The cache holds every key that is not revoked and is replaced whole on each reload
(a pub/sub message when a key is created or revoked, any other table push, and the
periodic refresh). A key expired for over ``EXPIRED_KEYS_KEPT_SECONDS`` is left out,
whatever table it came in (the database leaves it out too, ``catalog.keys.active_keys``;
a table saved before, or a static file, may not).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from protocol.rate_limits import Limits
from protocol.routing import EXPIRED_KEYS_KEPT_SECONDS
from router import errors


@dataclass(frozen=True, slots=True)
class Caller:
    """Who is asking: the key's name and prefix (for accounting) and what it may use."""

    name: str
    prefix: str
    models: frozenset[str]  # empty: every model
    limits: Limits = field(default_factory=Limits)
    expires_at: float | None = None  # unix time; None: never
    priority: str = "normal"
    # The account a key was issued to (the playground's keys), "" for a key of its own:
    # what the key makes (kept responses) belongs to the account, through every renewal.
    user: str = ""
    # The team it spends for ("" in a table from before teams): its budgets, held for all
    # its keys together, and the models it may use (None: every model).
    team: str = ""
    team_limits: Limits = field(default_factory=Limits)
    team_models: frozenset[str] | None = None
    # The limits of ``limits`` that the team's cap per key set (a refusal names the cap).
    capped: frozenset[str] = frozenset()

    @property
    def owner(self) -> str:
        """Who what this key makes belongs to: its account, else the key itself (its prefix
        is unique, its name said)."""
        return f"user:{self.user}" if self.user else f"{self.prefix}:{self.name}"

    def may_use(self, names: frozenset[str]) -> bool:
        """Whether the key covers a model known by any of ``names`` (its name and aliases)
        and the model is open to its team."""
        return self.sees(names) and (not self.models or not self.models.isdisjoint(names))

    def sees(self, names: frozenset[str]) -> bool:
        """Whether the model known by ``names`` is open to the key's team: a model closed
        to it does not exist for it (404, as a name nobody serves)."""
        return self.team_models is None or not self.team_models.isdisjoint(names)


def _names(names: Iterable[str] | None) -> frozenset[str] | None:
    return None if names is None else frozenset(names)


# Requests when the static file says `auth: false`.
ANONYMOUS = Caller(name="anonymous", prefix="", models=frozenset())


class KeyCache:
    """Every usable key by its hash; ``None`` keys means authentication is off."""

    def __init__(self) -> None:
        self._by_hash: dict[str, Caller] | None = {}

    def replace(self, keys: Iterable[dict[str, Any]] | None) -> None:
        if keys is None:
            self._by_hash = None
            return
        # A table saved by an older router has no limits, expiry or priority: none then.
        gone_before = time.time() - EXPIRED_KEYS_KEPT_SECONDS
        self._by_hash = {
            k["sha256"]: Caller(
                name=k["name"],
                prefix=k["prefix"],
                models=frozenset(k["models"]),
                limits=Limits.from_dict(k.get("limits")),
                expires_at=k.get("expires_at"),
                priority=k.get("priority") or "normal",
                user=str(k.get("user") or ""),
                team=k.get("team") or "",
                team_limits=Limits.from_dict(k.get("team_limits")),
                team_models=_names(k.get("team_models")),
                capped=frozenset(k.get("capped") or ()),
            )
            for k in keys
            if k.get("expires_at") is None or k["expires_at"] > gone_before
        }

    def __len__(self) -> int:
        return 0 if self._by_hash is None else len(self._by_hash)

    def team_keys(self, team: str) -> list[str]:
        """The prefixes of the team's keys this router knows (its ledger is theirs)."""
        return sorted(c.prefix for c in (self._by_hash or {}).values() if c.team == team)

    def teams_of(self, prefixes: set[str]) -> set[str]:
        """The teams these keys spend for."""
        return {c.team for c in (self._by_hash or {}).values() if c.prefix in prefixes and c.team}

    def authenticate(self, authorization: bytes | None, api_key: bytes | None = None) -> Caller:
        """The caller behind an Authorization header (or, without one, an ``x-api-key``
        header, as Anthropic's clients send the key), or the 401 to answer."""
        if authorization is None and api_key:
            authorization = b"Bearer " + api_key
        by_hash = self._by_hash
        if by_hash is None:
            return ANONYMOUS
        if not authorization:
            raise errors.missing_key()
        scheme, _, key = authorization.partition(b" ")
        key = key.strip()
        if scheme.lower() != b"bearer" or not key:
            raise errors.missing_key()
        caller = by_hash.get(hashlib.sha256(key).hexdigest())
        if caller is None:
            raise errors.bad_key()
        if caller.expires_at is not None and time.time() >= caller.expires_at:
            raise errors.expired_key(caller.name, caller.prefix, caller.expires_at)
        return caller
