"""Telling every node which engine versions to have, and whether it drains.

A node is told when it links (its agent may have restarted and forgotten), when the
catalog's engines change, and every ten minutes, so a command lost on the way costs ten
minutes at most. The agent converges on the list; what it has, and how each install is
going, comes back in its ``engines`` messages (``Node.engines``).

A pass tells at most TOLD_PER_PASS nodes: after a control plane restart every node links
again at once, and telling 2,000 of them (two commands each, ~1.5 ms apiece through
Celery) would hold one pass for seconds. The rest are told by the passes that follow.
"""

from __future__ import annotations

import hashlib
import json
import logging
from datetime import datetime

from pydantic import ValidationError

from audit.actors import RECONCILER
from catalog.models import Engine, default_engines
from fleet import commands
from fleet.actions.nodes import mark_engines_told
from fleet.models import Node, NodeState
from protocol.engines import WantedEngine

log = logging.getLogger("llmgw.fleet.engines")

# Nodes told per pass (a pass every 2 s): 2,000 nodes that link at once are all told
# within 80 s; a steady fleet of that size has ~7 due a pass (every ten minutes each).
TOLD_PER_PASS = 50


def wanted_engines() -> list[WantedEngine]:
    """Every engine version the catalog names, and the default build of each engine it
    names none of (rule R103): each node should have them all."""
    named = []
    for engine in Engine.objects.order_by("name", "version"):
        try:
            named.append(engine.wanted())
        except ValidationError as exc:
            # Saved before the catalog checked it (an older release, a hand-edited row):
            # one bad row must not keep every node from its other engines.
            reason = "; ".join(error["msg"] for error in exc.errors())
            log.warning("engine %s %r is not told to any node: %s; correct or remove it with "
                        "llmgw_ctl apply", engine.name, engine.version, reason)  # fmt: skip
    return named + default_engines(engine.name for engine in named)


def engines_digest(engines: list[WantedEngine]) -> str:
    text = json.dumps([engine.model_dump(mode="json") for engine in engines], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def tell_nodes_their_engines(now: datetime) -> list[str]:
    """Send ``converge_engines`` (and the node's drain) to the connected nodes that are due,
    draining ones and the longest untold first, at most TOLD_PER_PASS of them."""
    engines = wanted_engines()
    digest = engines_digest(engines)
    connected = Node.objects.filter(state=NodeState.CONNECTED).only(
        "id", "draining", "registered_at", "engines_told", "engines_told_at", "key_generation"
    )
    due = [node for node in connected if node.engines_due(digest, now)]
    due.sort(key=lambda node: _urgency(node, now))
    told = []
    try:
        with commands.one_connection() as producer:
            for node in due[:TOLD_PER_PASS]:
                generation = node.key_generation  # read with the nodes: no query per send
                commands.send_converge_engines(node.id, engines, producer, generation)
                commands.send_drain(node.id, node.draining, producer, generation)
                told.append(node.id)
    except Exception as exc:
        # The broker is away: those not told are told by a later pass (nothing marks them).
        log.warning("could not tell %d node(s) their engines: %s", len(due) - len(told), exc)
    mark_engines_told(told, engines, digest, now, actor=RECONCILER)
    return told


def _urgency(node: Node, now: datetime) -> tuple[bool, bool, datetime]:
    """Draining nodes first (an agent that just linked may not know of its drain), then the
    never told, then the longest untold."""
    told_at = node.engines_told_at
    return (not node.draining, told_at is not None, told_at or now)
