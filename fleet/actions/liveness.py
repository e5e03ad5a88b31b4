"""Verbs on a node's liveness: it fell silent (unreachable, then lost), or spoke again.

The liveness check (``fleet.link.liveness``, acting as ``LIVENESS``) marks silent nodes;
the heartbeat batch (``fleet.link.heartbeats``, as ``AGENT_LINK``) revives one that
speaks again. Each is the node state machine's compare-and-swap with its Event, so a
heartbeat racing the check has one winner. A lost node's engines are not assumed dead.
"""

from __future__ import annotations

from audit.actors import Actor
from fleet.models import Node, NodeState
from fleet.transitions import transition


def mark_node_unreachable(node_id: str, why: str, *, actor: Actor) -> bool:
    """Mark a connected node unreachable (``why``: how long it has been silent); False if
    it was not connected any more."""
    return transition(Node, node_id, NodeState.UNREACHABLE, why, actor=actor) is not None


def mark_node_lost(node_id: str, why: str, *, actor: Actor) -> bool:
    """Mark a silent node lost, so its replicas are placed elsewhere; False if it was lost
    already or spoke meanwhile."""
    return transition(Node, node_id, NodeState.LOST, why, actor=actor) is not None


def revive_node(node_id: str, *, actor: Actor) -> bool:
    """Bring an unreachable or lost node back: it was heard again. False if it was not
    marked silent."""
    return (
        transition(Node, node_id, NodeState.CONNECTED, "heartbeat received again", actor=actor)
        is not None
    )
