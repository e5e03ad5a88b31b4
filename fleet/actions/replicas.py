"""Verbs on replicas: create one for a profile, start it where placement chose, note why it
cannot be placed (and have that worked out again), fail one that did not start in time,
drain it out of the routing table, stop it, finish its stop, restart it (stop, and let the
reconciler start a fresh one with the profile's current settings), and say why one on a
lost node is kept or how a profile's rolling restart stands.

Each says what it did (the replica, or whether it changed anything) and leaves counting
to its caller: the reconciler's report is the reconciler's.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection
from datetime import datetime
from functools import partial

from django.db import transaction
from django.db.models import Prefetch
from django.utils import timezone

from audit import notices
from audit.actors import Actor
from audit.events import record_event, record_news
from audit.models import EventKind
from catalog.models import Model, Profile, newest_engine_versions
from core.humanize import no_such
from fleet import commands
from fleet.members import engine_callers
from fleet.models import Node, Replica, ReplicaState, Shard, ShardState
from fleet.pki.keys import replica_secret
from fleet.planning.shard_specs import allocate_port, meeting_points, shard_spec, version_on_nodes
from fleet.planning.stop_order import held_stop_reason, held_stops_due
from fleet.transitions import transition
from placement import Decision
from protocol.shard import ranks_of


def create_replica(
    profile: Profile, why: str, *, actor: Actor, stands_in_since: datetime | None = None
) -> Replica:
    """A new replica of ``profile`` with its current settings, waiting to be placed; a
    stand-in (``stands_in_since``) for replicas no router reaches, beyond its count.

    Its engine version is the profile's resolved one; "" (no pin, none in the catalog)
    is settled when it is placed, from what the chosen node has.
    """
    replica_id = uuid.uuid4()
    newest = newest_engine_versions()
    with transaction.atomic():
        replica = Replica.objects.create(
            id=replica_id,
            model_name=profile.model.name,
            profile_name=profile.name,
            profile=profile,
            fingerprint=profile.fingerprint(newest),
            engine=profile.engine,
            engine_version=profile.resolved_engine_version(newest),
            secret=replica_secret(replica_id),
            stands_in_since=stands_in_since,
        )
        record_event(EventKind.REPLICA, str(replica.id), why, to_state=ReplicaState.PLACING,
                     actor=actor)  # fmt: skip
    return replica


def start_replica(replica: Replica, decision: Decision, *, actor: Actor, epoch: int) -> bool:
    """Start ``replica`` where ``decision`` placed it: its shards, and a start command to
    each node once they commit. False when another pass moved the replica on first.

    ``epoch`` is the leader epoch the commands are sent under.
    """
    assert replica.profile is not None
    with transaction.atomic():
        if replica.state == ReplicaState.UNPLACEABLE and not transition(
            Replica, replica.id, ReplicaState.PLACING, "resources became available", actor=actor
        ):
            return False
        nodes = {node.id: node for node in Node.objects.filter(
            id__in=[rank.node for rank in decision.ranks])}  # fmt: skip
        engine = replica.profile.engine
        # Settled here at the latest, by the control plane: the spec names it, so the
        # node runs exactly this one and never the first it finds.
        version = replica.version_to_run() or version_on_nodes(engine, nodes.values())
        runs = f"{engine} {version}" if version else f"{engine} (its node reports no version)"
        # The adapters it loads are those of the catalog now; the spec carries the same.
        adapters = replica.profile.model.adapter_specs(replica.profile)
        if not transition(
            Replica, replica.id, ReplicaState.STARTING,
            f"placed on {', '.join(rank.node for rank in decision.ranks)}, running {runs}",
            actor=actor, reasons=[], reasons_at=None, starting_since=timezone.now(),
            engine=engine, engine_version=version,
            adapters=[adapter.name for adapter in adapters],
        ):  # fmt: skip
            return False
        replica.engine, replica.engine_version = engine, version
        shards = []
        for rank in decision.ranks:
            shards.append(
                Shard.objects.create(
                    id=Shard.new_id(),
                    replica=replica,
                    rank=rank.rank,
                    node=nodes[rank.node],
                    gpus=list(rank.gpus),
                    port=allocate_port(rank.node),
                )
            )
        meeting = meeting_points(shards, nodes, [rank.fabric for rank in decision.ranks])
        callers = engine_callers()
        for shard, rank in zip(shards, decision.ranks, strict=True):
            spec = shard_spec(replica, shard, nodes[rank.node], len(shards), meeting,
                              rank.fabric, epoch, callers, adapters)  # fmt: skip
            transaction.on_commit(partial(commands.send_start_shard, rank.node, spec))
    return True


def note_unplaceable(
    replica: Replica, decision: Decision, *, actor: Actor, now: datetime | None = None
) -> bool:
    """Say why no node can take ``replica`` now, and when that was worked out (``now``);
    True when it has just become unplaceable.

    One already unplaceable keeps its state; only its reasons follow what placement says.
    """
    if not decision.explained and replica.state != ReplicaState.PLACING:
        return False  # placement did not work out why again: what it said last still holds
    reasons = [decision.summary, *decision.reasons_in_brief]
    at = (now or timezone.now()) if decision.explained else None
    if replica.state == ReplicaState.PLACING:
        return bool(transition(Replica, replica.id, ReplicaState.UNPLACEABLE, decision.summary,
                               actor=actor, reasons=reasons, reasons_at=at))  # fmt: skip
    Replica.objects.filter(id=replica.id).update(reasons=reasons, reasons_at=at)
    # Pages say how old the refusal is: they learn it was worked out again, whatever it says.
    notices.pages_changed_on_commit(EventKind.REPLICA, str(replica.id))
    return False


class ReplicaRefused(Exception):
    """A replica verb that cannot be done as asked; ``str()`` names the thing and the fix."""


def check_placement_again(model_name: str, *, actor: Actor) -> int:
    """Have the next reconcile pass work out again why ``model_name``'s waiting replicas
    are refused, rather than 30 to 60 s after it last did; return how many wait.

    The Event is what the pass reads (``fleet.reconcile.passes``), as it reads a drain, a
    pool or an apply: whatever an operator does there, the refusal shown is worked out anew.
    """
    waiting = Replica.objects.filter(model_name=model_name, state__in=ReplicaState.UNPLACED)
    with transaction.atomic():
        count = waiting.count()
        if not count and not Model.objects.filter(name=model_name).exists():
            models = list(Model.objects.order_by("name").values_list("name", flat=True))
            raise ReplicaRefused(no_such("model", model_name, models))
        if not count:
            raise ReplicaRefused(f"no replica of {model_name} is waiting for a node: there "
                                 "is no refusal to work out again")  # fmt: skip
        asked = f"asked to work out again where {model_name}'s replicas fit"
        record_event(EventKind.PLACEMENT, model_name, asked, actor=actor)
    return count


def fail_replica(replica_id, reason: str, *, actor: Actor) -> bool:
    """Mark a starting or ready replica failed for ``reason`` (a start that outlived its
    profile's startup timeout, say); its replacement waits out the crash loop's backoff.
    False when it had moved on meanwhile."""
    failed = transition(Replica, replica_id, ReplicaState.FAILED, reason, actor=actor,
                        reasons=[reason])  # fmt: skip
    return failed is not None


def drain_replica(
    replica: Replica, now: datetime, profile: Profile, because: str, *, actor: Actor
) -> bool:
    """Take a ready replica out of the routing table; it is stopped once its drain is over.

    False when it is not ready or already draining.
    """
    with transaction.atomic():
        taken = Replica.objects.filter(
            id=replica.id, state=ReplicaState.READY, draining_since__isnull=True
        ).update(draining_since=now)
        if not taken:
            return False
        record_event(
            EventKind.REPLICA,
            str(replica.id),
            f"draining {because}: no new requests; "
            f"stopped once its requests are done (at most {profile.drain_timeout}s)",
            actor=actor,
        )
        # Routers drop it from their tables now, not at their next refresh.
        notices.routers_reload_on_commit("replicas")
    replica.draining_since = now
    return True


def stop_replica(replica: Replica, reason: str, *, actor: Actor, epoch: int | None = None) -> bool:
    """Move a replica to stopping and tell its nodes to stop its shards: across nodes, the
    ranks that connect first (llama.cpp's rank 0, vLLM's workers), and the ranks they
    connect to once those have stopped (``release_held_stops``): a rank whose peer
    vanished under it aborts with a backtrace, or hangs.

    ``epoch`` is the leader epoch the caller acts under (the reconciler's own); None for
    an operator's action, which acts under the current lease.
    """

    with transaction.atomic():
        if (
            transition(Replica, replica.id, ReplicaState.STOPPING, reason, actor=actor,
                       reasons=[reason])
            is None
        ):  # fmt: skip
            return False
        live = replica.shards.exclude(state__in=ShardState.FINAL).exclude(node=None)
        ranks = [(rank, (node_id, shard_id)) for rank, node_id, shard_id
                 in live.values_list("rank", "node_id", "id")]  # fmt: skip
        first, held = ranks_of(replica.engine).stop_order(ranks)
        for node_id, shard_id in first or held:
            transaction.on_commit(partial(commands.send_stop_shard, node_id, shard_id, epoch))
    return True


def release_held_stops(
    replica: Replica | uuid.UUID | str,
    *,
    actor: Actor,
    epoch: int | None = None,
    now: datetime | None = None,
    answered: bool = True,
    already_sent: Collection[str] = (),
) -> list[str]:
    """Send the stops ``stop_replica`` held back, if they are due (``held_stops_due``),
    but those ``already_sent``; the shards told to stop, with an Event saying why now.
    The shards' own reports record their stops. A replica given as a row has its shards
    and their nodes prefetched (``with_shard_nodes``)."""
    if not isinstance(replica, Replica):
        nodes = Prefetch("shards__node", queryset=Node.objects.only("state"))
        found = Replica.objects.filter(id=replica).prefetch_related("shards", nodes).first()
        if found is None:
            return []
        replica = found
    due = held_stops_due(replica, now or timezone.now(), answered=answered)
    due = [shard for shard in due if shard.id not in already_sent]
    if not due:
        return []
    ranks = ", ".join(str(shard.rank) for shard in due)
    record_event(EventKind.REPLICA, str(replica.id),
                 f"stopping rank {ranks}: {held_stop_reason(replica, now or timezone.now())}",
                 actor=actor)  # fmt: skip
    for shard in due:
        node_id = str(shard.node_id)  # held_stops_due gives placed shards only
        transaction.on_commit(partial(commands.send_stop_shard, node_id, shard.id, epoch))
    return [shard.id for shard in due]


def finish_stop(replica_id, *, actor: Actor) -> bool:
    """Mark a stopping replica stopped: none of its shards can still be running. False when
    it was not stopping."""
    stopped = transition(Replica, replica_id, ReplicaState.STOPPED, "every shard has stopped",
                         actor=actor)  # fmt: skip
    return stopped is not None


def restart_replica(replica_id, *, actor: Actor) -> bool:
    """Mark a replica for replacement: it stops, and the reconciler starts a fresh one.

    That is how a stale replica picks up its profile's new settings. False when the
    replica is gone or already stopping.
    """
    with transaction.atomic():
        replica = Replica.objects.filter(id=replica_id).first()
        # Stopping tells the nodes to stop the engines; the reconciler replaces it.
        return replica is not None and stop_replica(replica, "restart requested", actor=actor)


def adopt_stand_in(replica_id, why: str, *, actor: Actor) -> bool:
    """Count a stand-in as one of its profile's replicas from now on (the ones it stood in
    for are lost, and it serves as their replacement); False if it was not a stand-in."""
    with transaction.atomic():
        adopted = Replica.objects.filter(id=replica_id, stands_in_since__isnull=False).update(
            stands_in_since=None
        )
        if adopted:
            record_event(EventKind.REPLICA, str(replica_id), why, actor=actor)
    return bool(adopted)


def note_replica_kept(replica_id, why: str, *, actor: Actor) -> bool:
    """Say why a replica on a lost node keeps its place (no other node can take it, or it
    serves until its replacement is ready): once, not at every pass. False when that was
    already the last thing said of it."""
    return record_news(EventKind.REPLICA, str(replica_id), why, actor=actor) is not None


def note_rollout(profile: Profile, news: str, *, actor: Actor) -> bool:
    """Say how ``profile``'s rolling restart stands (what it waits for, or that it is
    over): once, not at every pass. False when that was already the last thing said."""
    return record_news(EventKind.CATALOG, str(profile), news, actor=actor) is not None
