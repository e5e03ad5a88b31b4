"""Roles from the provider's word: one claim (``groups`` by default) and a map from its
values to llmgw's roles, so the company's directory says who operates the fleet.

``roles_from_claims`` is the one place claims become roles. Today a role is one of the
fleet-wide groups (``operators``, ``engine-admin``, the playground's group) or ``reader``
(admitted, no group) or a role in a team, ``team:<name>:<role>`` (``team:research:lead``),
applied beside the groups by ``catalog.teams.actions.set_provider_team_roles``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from catalog.models import Membership
from catalog.permissions import ENGINE_ADMINS_GROUP, OPERATORS_GROUP

# Admitted with no group: sees what every signed-in user sees.
READER = "reader"


def group_roles() -> frozenset[str]:
    """The roles that are Django groups: the ones a sign-in sets, and only these."""
    return frozenset({OPERATORS_GROUP, ENGINE_ADMINS_GROUP, settings.PLAYGROUND_GROUP})


def role_map(entries: Iterable[str] | None = None) -> dict[str, frozenset[str]]:
    """``LLMGW_OIDC_ROLE_MAP`` read: each claim value and the roles it gives.

    Entries are ``value=role``; a value may appear more than once to give several roles.
    A role llmgw does not know stops the sign-in with the entry named, rather than
    admitting people with less (or more) than the operator meant.
    """
    known = group_roles() | {READER}
    found: dict[str, set[str]] = {}
    for entry in settings.OIDC_ROLE_MAP if entries is None else entries:
        value, sep, role = entry.rpartition("=")
        value, role = value.strip(), role.strip()
        if not sep or not value or (role not in known and team_role(role) is None):
            raise ImproperlyConfigured(
                f"LLMGW_OIDC_ROLE_MAP entry {entry!r}: write claim-value=role, the role one "
                f"of {', '.join(sorted(known))}, or team:NAME:ROLE with ROLE one of "
                f"{', '.join(Membership.Role.values)}"
            )
        found.setdefault(value, set()).add(role)
    return {value: frozenset(roles) for value, roles in found.items()}


def team_role(role: str) -> tuple[str, str] | None:
    """``team:research:lead`` read as (team, role); None for any other role."""
    kind, _sep, rest = role.partition(":")
    team, _sep, held = rest.partition(":")
    if kind != "team" or not team or held not in Membership.Role.values:
        return None
    return team, held


def team_roles(roles: Iterable[str]) -> dict[str, str]:
    """Each team's role among ``roles``: the highest, where several claim values give one."""
    ranks = {role: rank for rank, role in enumerate(Membership.Role.values)}
    found: dict[str, str] = {}
    for role in roles:
        parsed = team_role(role)
        if parsed is not None:
            team, held = parsed
            if team not in found or ranks[held] > ranks[found[team]]:
                found[team] = held
    return found


def mapped_teams(mapping: Mapping[str, frozenset[str]]) -> frozenset[str]:
    """The teams the map can give roles in: a sign-in sets the person's role in these, and
    only these (a role in another team is its lead's to give)."""
    return frozenset(team_roles(role for roles in mapping.values() for role in roles))


def claim_values(claims: Mapping[str, Any], claim: str | None = None) -> list[str]:
    """The values of ``claim`` (a dotted path reaches into objects): a list of strings,
    or one string, as providers send either; anything else gives none."""
    found: Any = claims
    for part in (claim or settings.OIDC_ROLES_CLAIM).split("."):
        found = found.get(part) if isinstance(found, Mapping) else None
    if isinstance(found, str):
        return [found]
    if isinstance(found, list | tuple):
        return [str(value) for value in found if isinstance(value, str | int)]
    return []


def roles_from_claims(
    claims: Mapping[str, Any], mapping: Mapping[str, frozenset[str]] | None = None
) -> frozenset[str]:
    """The roles a person holds, by the provider's claims and the configured map."""
    mapping = role_map() if mapping is None else mapping
    roles: set[str] = set()
    for value in claim_values(claims):
        roles |= mapping.get(value, frozenset())
    return frozenset(roles)
