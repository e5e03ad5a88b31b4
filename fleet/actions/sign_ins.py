"""Verbs on sign-in: a (username, address) pair locked out after too many failed passwords.

The lockout itself lives in Redis (``fleet.pages.sign_in``), shared by every control-plane
process; this records it in the Event log, where an operator looks for who was locked out.
"""

from __future__ import annotations

from audit.actors import Actor
from audit.events import record_event
from audit.models import EventKind


def record_lockout(username: str, address: str, failures: int, wait: str, *, actor: Actor) -> None:
    """Record that ``username`` must wait ``wait`` (in words) before signing in again from
    ``address``, after ``failures`` failed sign-ins."""
    record_event(
        EventKind.SIGN_IN,
        username,
        f"locked out from {address} for {wait} after {failures} failed sign-ins",
        to_state="locked",
        actor=actor,
    )
