"""Telling nodes who their walls admit on engines' HTTP ports: the routers and control
planes (``fleet.members``), within one pass of one joining or leaving.

Only the nodes that wall and run an engine are told (a StartShard carries the list too, so
a node without shards needs none), and only when the list changed since they were last
told, they linked again since, or ENGINES_RETOLD_AFTER passed (a command lost on the way).
Cost: one signed command per node told, 3.9 ms each through Celery on the project's 2-core
machine at load 7-10 (500 in 1.9 s); a pass sends at most TOLD_PER_PASS, the most urgent
first, so a router joining reaches 300 serving nodes within one pass and 5,000 within 17
(~34 s). Nothing is sent while the list stands still.
"""

from __future__ import annotations

import hashlib
import json
import logging
from datetime import datetime

from django.db.models import F, Q

from audit.actors import RECONCILER
from fleet import commands
from fleet.actions.members import mark_callers_told, record_members
from fleet.members import engine_callers, heard_members
from fleet.models import ENGINES_RETOLD_AFTER, Node, NodeState, Shard, ShardState

log = logging.getLogger("llmgw.fleet.callers")

# A pass every 2 s: ~1.2 s of sending at most on a busy machine, ~0.5 s on a quiet one.
TOLD_PER_PASS = 300


def callers_digest(callers: list[str]) -> str:
    return hashlib.sha256(json.dumps(sorted(callers)).encode()).hexdigest()


def tell_nodes_their_callers(now: datetime) -> list[str]:
    """Record the members heard, then send ``engine_callers`` to the walled nodes running
    an engine that are due; return the nodes told."""
    heard = heard_members()
    if heard is not None:
        record_members(heard, now, actor=RECONCILER)
    callers = engine_callers(now)
    digest = callers_digest(callers)
    serving = Shard.objects.filter(state__in=ShardState.LIVE).values("node_id")
    # The cheap columns first: the inventory (kilobytes of JSON a node) is read only for
    # nodes that are due.
    due_now = (
        Q(callers_told_at__isnull=True) | ~Q(callers_told=digest)
        | Q(registered_at__gte=F("callers_told_at"))
        | Q(callers_told_at__lte=now - ENGINES_RETOLD_AFTER)
    )  # fmt: skip
    candidates = Node.objects.filter(due_now, state=NodeState.CONNECTED, id__in=serving)
    walled = candidates.filter(inventory__firewall="nftables").only(
        "id", "registered_at", "callers_told", "callers_told_at", "key_generation"
    )
    due = list(walled)
    due.sort(key=lambda node: (node.callers_told == digest, node.callers_told_at or now))
    told = []
    try:
        with commands.one_connection() as producer:
            for node in due[:TOLD_PER_PASS]:
                commands.send_engine_callers(node.id, callers, producer, node.key_generation)
                told.append(node.id)
    except Exception as exc:
        # The broker is away: those not told are told by a later pass (nothing marks them).
        log.warning("could not tell %d node(s) their callers: %s", len(due) - len(told), exc)
    mark_callers_told(told, callers, digest, now, actor=RECONCILER)
    return told
