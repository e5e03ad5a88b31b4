"""Stand-ins: a model that no router reaches serves again in seconds, not minutes.

When every replica of a model that serves, or soon will, sits on nodes the control plane
no longer hears, and the routers' breakers have taken out each one of them that is ready,
a stand-in replica of its profile is placed at once on a node that is heard, beyond the
profile's count. Nothing is declared lost: the nodes are merely silent, and when most of
the fleet goes silent at once the mass-silence hold keeps them from being lost for
minutes (two of three nodes powered off kept a model down for 321 s).

A stand-in is retired (drained, then stopped) once one of its model's own replicas serves
from heard nodes again; once their nodes are lost instead, it counts as one of them, the
first of their replacements. Both pieces of evidence are needed: nodes silent to the
control plane alone (its own network is cut) and replicas one router cannot reach alone
(that router's network) make no stand-in.

Cost: one query for the nodes not connected each pass; replicas and the routers' reports
are read only when some node is silent or a stand-in lives.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from datetime import datetime

from audit.actors import RECONCILER
from fleet.actions.replicas import adopt_stand_in, create_replica, drain_replica, stop_replica
from fleet.models import Node, NodeState, Replica, ReplicaState, with_shard_nodes
from fleet.reconcile.report import ReconcileReport
from fleet.reconcile.rollout import Reports, drain_verdict, reports_once

# The states in which a replica serves, or will once its engines are up.
COMING = (ReplicaState.STARTING, ReplicaState.READY)


def keep_stand_ins(
    now: datetime,
    report: ReconcileReport,
    epoch: int | None = None,
    read: Callable[[], Reports] | None = None,
) -> None:
    """Place a stand-in for each model no router reaches, and retire or adopt each stand-in
    whose reason is gone."""
    silent = Node.objects.exclude(state=NodeState.CONNECTED)
    stand_ins = Replica.objects.filter(
        state__in=ReplicaState.COUNTED, stands_in_since__isnull=False
    )
    if not silent.exists() and not stand_ins.exists():
        return
    read = read or reports_once()
    counted = Replica.objects.filter(state__in=ReplicaState.COUNTED, profile__isnull=False)
    by_model: dict[str, list[Replica]] = defaultdict(list)
    for replica in with_shard_nodes(
        counted.select_related("profile__model").order_by("created_at")
    ):
        by_model[replica.model_name].append(replica)
    for model, replicas in by_model.items():
        standing = [r for r in replicas if r.stands_in_since is not None]
        originals = [r for r in replicas if r.stands_in_since is None]
        if standing:
            for stand_in in standing:
                _settle(stand_in, originals, now, report, epoch, read)
            continue
        unreachable = _unreachable(originals, read)
        if unreachable:
            _stand_in(model, unreachable, now, report)


def _heard(replica: Replica) -> bool:
    """Every node of its shards is connected (a replica not yet placed has none)."""
    shards = list(replica.shards.all())
    return bool(shards) and all(
        shard.node is not None and shard.node.state == NodeState.CONNECTED for shard in shards
    )


def _on(replica: Replica, state: str) -> list[str]:
    """The nodes of its shards in ``state``."""
    return [
        shard.node.id
        for shard in replica.shards.all()
        if shard.node is not None and shard.node.state == state
    ]


def _serving(replica: Replica) -> bool:
    return (
        replica.state == ReplicaState.READY and replica.draining_since is None and _heard(replica)
    )


def _unreachable(originals: list[Replica], read: Callable[[], Reports]) -> list[Replica]:
    """The replicas of a model that serve or will, when every one of them is on a silent
    node and the routers' breakers took out each that is ready; [] otherwise."""
    coming = [r for r in originals if r.state in COMING and r.draining_since is None]
    if not coming or any(_heard(r) for r in coming):
        return []
    if any(_on(r, NodeState.LOST) for r in coming):
        return []  # lost nodes' replicas are replaced by scale(), which counts them out
    ready = [str(r.id) for r in coming if r.state == ReplicaState.READY]
    if ready:
        reports = read()
        if not reports:
            return []  # no router says anything (Redis away, or none runs): no evidence
        failing = {replica for one in reports for replica in one.get("failing", [])}
        if not failing.issuperset(ready):
            return []  # some router may still reach one
    return coming


def _stand_in(
    model: str, unreachable: list[Replica], now: datetime, report: ReconcileReport
) -> None:
    profile = unreachable[0].profile
    assert profile is not None  # counted only with a profile
    silent = sorted({node for r in unreachable for node in _on(r, NodeState.UNREACHABLE)})
    why = (f"stands in for the {len(unreachable)} replica(s) of {model} no router reaches, on "
           f"{', '.join(silent)} (not heard, not yet lost); retired once one of them answers "
           "again, counted as one of them once their nodes are lost")  # fmt: skip
    created = create_replica(profile, why, actor=RECONCILER, stands_in_since=now)
    report.created.append(str(created.id))


def _settle(
    stand_in: Replica, originals: list[Replica], now: datetime, report: ReconcileReport,
    epoch: int | None, read: Callable[[], Reports],
) -> None:  # fmt: skip
    """Retire a stand-in whose model's own replicas serve again; adopt one whose originals'
    nodes are lost; else let it serve."""
    profile = stand_in.profile
    assert profile is not None
    if stand_in.draining_since is not None:
        verdict = drain_verdict(stand_in, now, profile.drain_timeout, read)
        if verdict is not None:
            why = f"stand-in retired: its model's own replicas answer again; {verdict}"
            if stop_replica(stand_in, why, actor=RECONCILER, epoch=epoch):
                report.stopping.append(str(stand_in.id))
        return
    if any(_serving(r) for r in originals):
        because = "as a stand-in: its model's own replicas answer again"
        if stand_in.state == ReplicaState.READY:
            if drain_replica(stand_in, now, profile, because, actor=RECONCILER):
                report.draining.append(str(stand_in.id))
        elif stop_replica(stand_in, f"not needed {because}", actor=RECONCILER, epoch=epoch):
            report.stopping.append(str(stand_in.id))
        return
    lost = sorted({node for r in originals for node in _on(r, NodeState.LOST)})
    if lost:
        why = (f"counts as one of {profile}'s replicas from now on: {', '.join(lost)} "
               "lost, it replaces one of theirs")  # fmt: skip
        adopt_stand_in(stand_in.id, why, actor=RECONCILER)
