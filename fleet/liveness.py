"""Node liveness: stored states follow ``Node.liveness_at`` (unreachable 15 s, lost 60 s).

If most of the fleet goes silent at once, the likelier story is that the control
plane lost its network or its Redis, not that every node died — so nothing is
marked lost, and the log says why (Kubernetes' node lifecycle controller does the
same). A lost node's engines are not assumed dead.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

from django.db import transaction
from django.utils import timezone

from fleet.models import Node, NodeState
from fleet.transitions import transition

log = logging.getLogger("llmgw.fleet.liveness")

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


def check_liveness(
    now: datetime | None = None, grace_until: datetime | None = None
) -> LivenessReport:
    """Move silent nodes along; one pass, callable directly with an injected clock.

    ``grace_until``: after a leader failover, nodes are not declared lost before then.
    """
    now = now or timezone.now()
    nodes = list(Node.objects.exclude(state=NodeState.LOST).only(*_HEARD))
    silent = [node.id for node in nodes if node.liveness_at(now) != NodeState.CONNECTED]
    report = LivenessReport(unreachable=[], lost=[])
    if len(nodes) >= MASS_SILENCE_MIN_NODES and len(silent) / len(nodes) > MASS_SILENCE_SHARE:
        log.error(
            "%d of %d nodes went silent at once; suspecting the control plane's own network "
            "or Redis rather than the nodes, so none is marked unreachable or lost",
            len(silent), len(nodes),
        )  # fmt: skip
        report.held_back = True
        return report
    in_grace = grace_until is not None and now < grace_until
    for node_id in silent:
        with transaction.atomic():
            # Re-read under the row lock: a heartbeat batch written since the list above was
            # read must win, or a node that just spoke is marked lost and its replicas moved.
            # A batch that comes after waits on this lock, then revives what we marked.
            node = Node.objects.select_for_update().only(*_HEARD).filter(id=node_id).first()
            if node is None or (liveness := node.liveness_at(now)) == NodeState.CONNECTED:
                continue
            reason = f"no heartbeat for {int(node.silence(now).total_seconds())}s"
            if liveness == NodeState.LOST and not in_grace:
                if transition(Node, node_id, NodeState.LOST, reason):
                    report.lost.append(node_id)
            elif node.state == NodeState.CONNECTED and transition(
                Node, node_id, NodeState.UNREACHABLE, reason
            ):
                report.unreachable.append(node_id)
    return report
