"""Who the engines' HTTP ports must admit: the routers and the control planes.

Each router process says so in its in-flight report (``protocol.routing``: its
``addresses``, every second); each control-plane process writes ``MEMBER_KEY_PREFIX`` +
its id every ``MEMBER_REFRESH`` seconds with a ``MEMBER_TTL`` expiry. Either writes
``LEFT_KEY_PREFIX`` + its id as it stops cleanly, so the leader takes it out at its next
pass; one that stops silently is taken out once unheard for ``fleet.members.MEMBER_GRACE``.
The leader keeps what it heard in the database (``fleet.models.FleetMember``) and tells
every node that runs an engine the addresses its walls admit (``EngineCallers``).
"""

from __future__ import annotations

ROUTER = "router"
CONTROL_PLANE = "control-plane"
ROLES = (ROUTER, CONTROL_PLANE)

# llmgw:member:control-plane:<id> -> {"at": unix time, "addresses": [...]}
MEMBER_KEY_PREFIX = "llmgw:member:"
# llmgw:member-left:<role>:<id> -> {"at": unix time}: it stopped cleanly.
LEFT_KEY_PREFIX = "llmgw:member-left:"
MEMBER_REFRESH = 10.0
MEMBER_TTL = 30
LEFT_TTL = 600
