"""Telling every node which engine versions to have, and whether it drains.

A node is told when it links (its agent may have restarted and forgotten), when the
catalog's engines change, and every ten minutes, so a command lost on the way costs ten
minutes at most. The agent converges on the list; what it has, and how each install is
going, comes back in its ``engines`` messages (``Node.engines``).
"""

from __future__ import annotations

import hashlib
import json
import logging
from datetime import datetime

from audit.actors import RECONCILER
from catalog.models import Engine
from fleet import commands
from fleet.actions.nodes import mark_engines_told
from fleet.models import Node, NodeState
from protocol.engines import WantedEngine

log = logging.getLogger("llmgw.fleet.engines")


def wanted_engines() -> list[WantedEngine]:
    """Every engine version the catalog names: each node should have them all."""
    return [engine.wanted() for engine in Engine.objects.order_by("name", "version")]


def engines_digest(engines: list[WantedEngine]) -> str:
    text = json.dumps([engine.model_dump(mode="json") for engine in engines], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def tell_nodes_their_engines(now: datetime) -> list[str]:
    """Send ``converge_engines`` (and the node's drain) to each connected node that is due."""
    engines = wanted_engines()
    digest = engines_digest(engines)
    told = []
    for node in Node.objects.filter(state=NodeState.CONNECTED):
        if not node.engines_due(digest, now):
            continue
        try:
            commands.send_converge_engines(node.id, engines)
            commands.send_drain(node.id, node.draining)
        except Exception as exc:
            # The broker is away: the next pass tries again, since nothing was marked.
            log.warning("could not tell node %s its engines: %s", node.id, exc)
            continue
        mark_engines_told(node.id, digest, now, actor=RECONCILER)
        told.append(node.id)
    return told
