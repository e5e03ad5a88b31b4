"""Node liveness: stored states follow ``Node.liveness_at`` (unreachable 15 s, lost 60 s).

If most of the fleet goes silent at once, the likelier story is that the control
plane lost its network or its Redis, not that every node died — so nothing is
marked unreachable or lost, and the log says why (Kubernetes' node lifecycle
controller does the same). The hold lasts while this control plane hears no node at
all; once it hears some, its own link works, and the hold ends NODE_MASS_SILENCE_HOLD
(5 minutes) after the silence became mass: dead nodes are lost then, not never. A lost
node's engines are not assumed dead.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from audit.actors import LIVENESS
from fleet.actions.liveness import mark_node_lost, mark_node_unreachable
from fleet.models import Node, NodeState

log = logging.getLogger("llmgw.fleet.link.liveness")

# Above this share of silent nodes (with at least MASS_SILENCE_MIN_NODES), suspect ourselves.
MASS_SILENCE_SHARE = 0.55
MASS_SILENCE_MIN_NODES = 3
# All that a node's liveness is read from.
_HEARD = ("id", "state", "last_heartbeat", "registered_at")


@dataclass
class LivenessReport:
    unreachable: list[str]
    lost: list[str]
    held_back: bool = False
    # Held back while no node at all was heard: this control plane was the one cut off.
    deaf: bool = False


def check_liveness(
    now: datetime | None = None, grace_until: datetime | None = None
) -> LivenessReport:
    """Move silent nodes along; one pass, callable directly with an injected clock.

    ``grace_until``: after a leader failover, nodes are not declared lost before then.
    """
    now = now or timezone.now()
    nodes = list(Node.objects.exclude(state=NodeState.LOST).only(*_HEARD))
    silent = [node for node in nodes if node.liveness_at(now) != NodeState.CONNECTED]
    report = LivenessReport(unreachable=[], lost=[])
    holding = _holding_back(nodes, silent, now)
    if holding:
        report.held_back, report.deaf = True, holding == DEAF
        return report
    in_grace = grace_until is not None and now < grace_until
    for node_id in (node.id for node in silent):
        with transaction.atomic():
            # Re-read under the row lock: a heartbeat batch written since the list above was
            # read must win, or a node that just spoke is marked lost and its replicas moved.
            # A batch that comes after waits on this lock, then revives what we marked.
            node = Node.objects.select_for_update().only(*_HEARD).filter(id=node_id).first()
            if node is None or (liveness := node.liveness_at(now)) == NodeState.CONNECTED:
                continue
            silence = node.silence(now)
            reason = f"no heartbeat for {int(silence.total_seconds()) if silence else 0}s"
            if liveness == NodeState.LOST and not in_grace:
                if mark_node_lost(node_id, reason, actor=LIVENESS):
                    report.lost.append(node_id)
            elif node.state == NodeState.CONNECTED and mark_node_unreachable(
                node_id, reason, actor=LIVENESS
            ):
                report.unreachable.append(node_id)
    return report


DEAF, HOLDING = "deaf", "holding"


def _holding_back(nodes: list[Node], silent: list[Node], now: datetime) -> str | None:
    """Whether a mass silence suspends marking: always while no node is heard (DEAF),
    otherwise until the hold has passed since the silence became mass (HOLDING). The
    hold (5 minutes) gives a control plane's flapping link or Redis failover time, and
    is short enough that dead nodes stop being chosen by placement within minutes."""
    since = mass_silence_since(nodes, silent, now)
    if since is None:
        return None
    # Heard lately; a node never heard from (no register yet) says nothing of our link.
    silent_ids = {node.id for node in silent}
    heard = sum(1 for n in nodes if n.id not in silent_ids and n.silence(now) is not None)
    hold = timedelta(seconds=settings.NODE_MASS_SILENCE_HOLD)
    if heard and now - since >= hold:
        log.warning(
            "%d of %d nodes silent for %ds while %d still heard: the hold is over, marking "
            "them as any silent node",
            len(silent), len(nodes), int((now - since).total_seconds()), heard,
        )  # fmt: skip
        return None
    log.error(
        "%d of %d nodes went silent at once; suspecting the control plane's own network "
        "or Redis rather than the nodes, so none is marked unreachable or lost%s",
        len(silent), len(nodes),
        f" (for up to {int(hold.total_seconds())}s while {heard} still heard)"
        if heard else " while no node is heard",
    )  # fmt: skip
    return HOLDING if heard else DEAF


def mass_silence_since(nodes: list[Node], silent: list[Node], now: datetime) -> datetime | None:
    """When the silence became mass: when the node that tipped the silent share over
    MASS_SILENCE_SHARE went silent; None while the silence is not mass."""
    if len(nodes) < MASS_SILENCE_MIN_NODES or len(silent) / len(nodes) <= MASS_SILENCE_SHARE:
        return None
    quiet_for = timedelta(seconds=settings.NODE_UNREACHABLE_AFTER)
    # A node is silent once quiet_for has passed since it was last heard.
    went_silent = sorted(now - (node.silence(now) or timedelta()) + quiet_for for node in silent)
    tipping = math.floor(MASS_SILENCE_SHARE * len(nodes)) + 1  # fewest silent over the share
    return went_silent[tipping - 1]
