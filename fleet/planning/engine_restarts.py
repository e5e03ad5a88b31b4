"""Running replicas that an engine version change restarts, counted before it happens.

An unpinned profile runs its engine's newest version in the catalog, or llmgw's default
build of it (rule R103). A version added to the catalog, or a control plane upgraded with
a newer default, changes what every such profile resolves to, and each of its running
replicas is replaced by a rolling restart. ``apply --dry-run`` and the deploy page count
them here; ``running_engine_versions`` is what ``catalog.actions.profiles.pin_engine_versions``
pins so that none is.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from catalog.models import Profile, newest_engine_versions
from fleet.models import Replica, ReplicaState

# The version a profile resolves to after a change; None when the change removes it.
Resolve = Callable[[Profile], "str | None"]


@dataclass(frozen=True)
class EngineRestart:
    """The replicas of one profile running ``running`` that would run ``resolved``."""

    profile: str  # "model/profile"
    engine: str
    running: str
    resolved: str
    replicas: int

    def describe(self) -> str:
        return (f"{self.profile}: {self.replicas} replica(s), {self.engine} {self.running} -> "
                f"{self.resolved}")  # fmt: skip


def _counted(models: Iterable[str] | None = None):
    replicas = Replica.objects.filter(state__in=ReplicaState.COUNTED, profile__isnull=False)
    if models is not None:
        replicas = replicas.filter(model_name__in=list(models))
    return replicas.exclude(engine_version="").select_related("profile__model")


def engine_restarts(
    resolve: Resolve | None = None, models: Iterable[str] | None = None
) -> list[EngineRestart]:
    """Per profile and version, the running replicas whose engine version is not the one
    their profile resolves to (``resolve``: as the catalog stands now, by default); a
    profile that resolves to none ("": the newest on the node) restarts nothing."""
    if resolve is None:
        newest = newest_engine_versions()

        def resolve(profile: Profile) -> str | None:
            return profile.resolved_engine_version(newest)

    counts: Counter[tuple[str, str, str, str]] = Counter()
    resolved: dict[int, str | None] = {}
    for replica in _counted(models):
        profile = replica.profile
        assert profile is not None  # filtered
        if profile.id not in resolved:
            resolved[profile.id] = resolve(profile)
        to = resolved[profile.id]
        if to and to != replica.engine_version:
            counts[(str(profile), profile.engine, replica.engine_version, to)] += 1
    return [EngineRestart(*key, replicas=count) for key, count in sorted(counts.items())]


def restart_lines(resolve: Resolve, *, planned: bool) -> list[str]:
    """What ``apply`` says of the replicas its change of versions (``resolve``) restarts:
    a count, then a line per profile and version."""
    restarts = engine_restarts(resolve)
    if not restarts:
        return []
    total = sum(restart.replicas for restart in restarts)
    verb = "would restart" if planned else "restarts"
    head = (f"an engine version change {verb} {total} running replica(s), one by one (pin "
            "the versions they run with llmgw_ctl pin-engines to keep them):")  # fmt: skip
    return [head, *(f"  {restart.describe()}" for restart in restarts)]


def running_engine_versions(models: Iterable[str] | None = None) -> dict[int, str]:
    """Unpinned profile id -> the engine version its running replicas run (the one most of
    them run, mid-rollout); what pinning "the version now running" pins."""
    by_profile: dict[int, Counter[str]] = {}
    for replica in _counted(models).filter(profile__engine_version=""):
        assert replica.profile_id is not None  # filtered
        by_profile.setdefault(replica.profile_id, Counter())[replica.engine_version] += 1
    return {profile: versions.most_common(1)[0][0] for profile, versions in by_profile.items()}
