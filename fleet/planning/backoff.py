"""A crash loop's backoff: how long a failed replica waits for its replacement, and the
words that say when the next try is due and why.

The wait doubles with each failure of the same profile in the last half hour that looks
like a crash loop, so a profile that cannot start does not relaunch an engine every two
seconds. A new spec starts it afresh, as a changed pod spec resets a CrashLoopBackOff:
a failure of a replica started with another fingerprint than its profile's now, or on a
node whose installed engines changed since, no longer counts. Otherwise the fix (a
catalog change, a rebuilt engine) would leave the model waiting minutes for nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from uuid import UUID

from django.db.models import Q

from audit.models import Event
from catalog.models import newest_engine_versions
from core.humanize import count_of, format_seconds
from fleet.models import Replica, ReplicaState, Shard

BASE_REPLACEMENT_DELAY = 5
MAX_REPLACEMENT_DELAY = 300
FAILURE_MEMORY = timedelta(minutes=30)
# A replica ready this long before it failed was serving, not crash-looping.
SETTLED = timedelta(seconds=60)


@dataclass(frozen=True)
class Backoff:
    """When a failed replica's replacement is due, and what that wait is made of."""

    delay: timedelta
    due_at: datetime
    failures: int  # in the last FAILURE_MEMORY, counted as a crash loop
    forgiven: int  # failed in that time, but before the profile or the node's engines changed
    last: str  # why the replica failed

    def explain(self, now: datetime) -> str:
        """'next try in 4 min: 3 failures in 30 min, last: rank 0 failed: …'."""
        wait = (self.due_at - now).total_seconds()
        when = f"next try in {format_seconds(wait)}" if wait >= 1 else "next try now"
        memory = format_seconds(FAILURE_MEMORY.total_seconds())
        why = f"{count_of(self.failures, 'failure')} in {memory}"
        if self.forgiven:
            why += (
                f" ({self.forgiven} more from before its profile or its node's engines "
                "changed, not counted)"
            )
        return f"{when}: {why}, last: {self.last or 'no reason recorded'}"


def replacement_backoff(replica: Replica, now: datetime) -> Backoff:
    """How long ``replica`` (failed) waits for its replacement, and why that long."""
    return replacement_backoffs([replica], now)[replica.id]


def replacement_backoffs(replicas: list[Replica], now: datetime) -> dict[UUID, Backoff]:
    """Each failed replica's backoff, by id: five queries however many there are (their
    profiles and models read with them).

    A replica that served for a while before its engine died (killed, out of memory) is
    not a loop: counting it would make a fleet that loses engines now and then wait
    minutes for every replacement.
    """
    if not replicas:
        return {}
    profiles = {(r.model_name, r.profile_name) for r in replicas}
    same_profile = Q()
    for model_name, profile_name in profiles:
        same_profile |= Q(model_name=model_name, profile_name=profile_name)
    siblings: dict[tuple[str, str], dict[str, str]] = {profile: {} for profile in profiles}
    for pk, model_name, profile_name, fingerprint in Replica.objects.filter(
        same_profile
    ).values_list("id", "model_name", "profile_name", "fingerprint"):
        siblings[(model_name, profile_name)][str(pk)] = fingerprint
    profile_of = {pk: profile for profile, fingerprints in siblings.items() for pk in fingerprints}
    failed = list(
        Event.objects.filter(
            kind="replica", to_state=ReplicaState.FAILED, at__gte=now - FAILURE_MEMORY,
            subject__in=list(profile_of),
        ).values_list("subject", "at")
    )  # fmt: skip
    subjects = {subject for subject, _at in failed}
    readies: dict[str, list[datetime]] = {}
    for subject, at in Event.objects.filter(
        kind="replica", to_state=ReplicaState.READY, subject__in=subjects
    ).values_list("subject", "at"):
        readies.setdefault(subject, []).append(at)
    engines_changed = _engines_changed_under(subjects)
    newest = newest_engine_versions()
    failed_by_profile: dict[tuple[str, str], list[tuple[str, datetime]]] = {}
    for subject, at in failed:
        failed_by_profile.setdefault(profile_of[subject], []).append((subject, at))
    backoffs = {}
    for replica in replicas:
        profile = (replica.model_name, replica.profile_name)
        spec = replica.profile.fingerprint(newest) if replica.profile is not None else None
        failures, forgiven = _count_failures(
            failed_by_profile.get(profile, []), siblings[profile], spec, readies, engines_changed
        )
        seconds = min(MAX_REPLACEMENT_DELAY, BASE_REPLACEMENT_DELAY * 2 ** max(0, failures - 1))
        delay = timedelta(seconds=seconds)
        backoffs[replica.id] = Backoff(
            delay=delay,
            due_at=replica.state_changed_at + delay,
            failures=failures,
            forgiven=forgiven,
            last="; ".join(replica.reasons),
        )
    return backoffs


def _count_failures(
    failed: list[tuple[str, datetime]],
    fingerprints: dict[str, str],
    spec: str | None,
    readies: dict[str, list[datetime]],
    engines_changed: dict[str, datetime],
) -> tuple[int, int]:
    """(failures that count as a crash loop, failures forgiven) of one profile's replicas:
    ``failed`` (replica id, when), each replica's ``fingerprints``, the profile's ``spec``
    now, and when each replica was ready and its nodes' engines last changed."""
    failures = forgiven = 0
    for subject, at in failed:
        changed = engines_changed.get(subject)
        another_spec = spec is not None and fingerprints[subject] != spec
        if another_spec or (changed is not None and changed > at):
            forgiven += 1
            continue
        ready_at = max((r for r in readies.get(subject, []) if r <= at), default=None)
        if ready_at is None or at - ready_at < SETTLED:
            failures += 1
    return failures, forgiven


def replacement_delay(replica: Replica, now: datetime) -> timedelta:
    """How long a failed replica waits for its replacement (``replacement_backoff``)."""
    return replacement_backoff(replica, now).delay


def _engines_changed_under(subjects: set[str]) -> dict[str, datetime]:
    """Replica id -> the latest change of installed engines on any node it ran on."""
    changed: dict[str, datetime] = {}
    for replica_id, at in Shard.objects.filter(
        replica_id__in=list(subjects), node__engines_changed_at__isnull=False
    ).values_list("replica_id", "node__engines_changed_at"):
        if at is None:
            continue  # filtered out above; the column is nullable
        key = str(replica_id)
        changed[key] = max(at, changed.get(key, at))
    return changed
