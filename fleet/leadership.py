"""Which control plane leads. Until several control planes run, this one always does."""

from __future__ import annotations


def leader_for_links() -> str | None:
    """None when this process may accept agent links; else the leader's address."""
    return None
