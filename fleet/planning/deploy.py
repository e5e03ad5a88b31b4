"""What deploying or changing a model would do now, shown before it is done: the catalog's
changes, the running replicas a rolling restart would replace, and where placement would
put the new replicas on the fleet as it is (or why not, node by node: in brief past ten nodes).

Nothing here writes: the changes are the catalog verb's own dry run, and placement is
asked with the reconciler's own snapshot and requests, so the plan and what follows agree.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from django.utils import timezone

from audit.actors import Actor
from catalog.actions.entries import apply_model
from catalog.fit.model_files import is_remote, shape_facts
from catalog.models import Model, Profile, newest_engine_versions
from catalog.plan import Change, profile_values
from catalog.schema import ModelEntry
from fleet.models import Replica, ReplicaState
from fleet.planning.engine_restarts import EngineRestart, Resolve, engine_restarts
from fleet.planning.snapshot import node_snapshots, placement_request
from placement import Decision, PlacementRequest, place_batch


@dataclass(frozen=True)
class ProfilePlan:
    """One profile's part: the replicas a rolling restart replaces, and where new ones go."""

    name: str  # "model/profile"
    replacing: int  # running replicas its new settings replace one by one (0: none)
    decisions: tuple[Decision, ...]  # one per new replica placement is asked about
    fit: str = ""  # the memory estimate from the model's file, and whether it is used
    warnings: tuple[str, ...] = ()  # a declared size below the estimate

    @property
    def placeable(self) -> bool:
        return all(decision.placed for decision in self.decisions)


@dataclass(frozen=True)
class ModelPlan:
    """What applying an entry would change, and what placement would do now."""

    changes: tuple[Change, ...]
    profiles: tuple[ProfilePlan, ...]
    digest: str  # the entry planned: applying another one needs a plan of its own
    # Running replicas whose engine version is not the one the entry resolves them to:
    # a catalog's new version or an upgraded default build replaces them, edit or not.
    engine_restarts: tuple[EngineRestart, ...] = ()

    @property
    def restarts(self) -> bool:
        """Say whether running replicas would be replaced (a rolling restart)."""
        return any(profile.replacing for profile in self.profiles)


def entry_digest(entry: ModelEntry) -> str:
    """A short hash of everything the entry says, to tell a planned entry from a changed one."""
    return hashlib.sha256(entry.model_dump_json().encode()).hexdigest()[:16]


def plan_model(entry: ModelEntry, *, creating: bool, actor: Actor) -> ModelPlan:
    """Plan ``entry`` (see ``catalog.actions.entries.apply_model``) without changing anything;
    raises CatalogError as applying it would."""
    changes = apply_model(entry, creating=creating, dry_run=True, actor=actor)
    changed = {change.name: change.action for change in changes if change.kind == "profile"}
    newest = newest_engine_versions()
    model = _unsaved_model(entry)
    wanted: list[tuple[Profile, int, list[PlacementRequest]]] = []
    for profile in entry.profiles:
        name = f"{entry.name}/{profile.name}"
        if name not in changed:
            continue
        unsaved = Profile(model=model, name=profile.name, **profile_values(profile))
        replacing, new = 0, unsaved.replicas
        if changed[name] == "update":
            replacing, new = _replaced_and_new(entry.name, unsaved, newest)
        requests = [placement_request(f"{name} (new {i + 1})", unsaved) for i in range(new)]
        wanted.append((unsaved, replacing, requests))
    # One batch, as the reconciler places: each new replica sees what the ones before took.
    every_request = [request for _profile, _replacing, requests in wanted for request in requests]
    decisions = iter(place_batch(every_request, node_snapshots(timezone.now())))
    profiles = tuple(
        ProfilePlan(
            str(profile),
            replacing,
            tuple(next(decisions) for _ in requests),
            fit=profile.fit_line,
            warnings=tuple(profile.needs().warnings),
        )
        for profile, replacing, requests in wanted
    )
    restarts = engine_restarts(_resolver(entry, newest), models=[entry.name])
    return ModelPlan(tuple(changes), profiles, entry_digest(entry), tuple(restarts))


def _resolver(entry: ModelEntry, newest: dict[str, str]) -> Resolve:
    """The engine version each of the model's profiles resolves to once ``entry`` is saved."""
    profiles = {profile.name: profile for profile in entry.profiles}

    def resolve(profile: Profile) -> str | None:
        planned = profiles.get(profile.name)
        if planned is None:
            return None  # the entry drops it: stopped, not restarted
        return planned.engine_version or newest.get(planned.engine, "")

    return resolve


def _unsaved_model(entry: ModelEntry) -> Model:
    """The model row the entry would write, unsaved, with what its file says (as
    ``catalog.plan.fit_lines`` reads it for a dry run): what placement, fingerprints and
    the estimate read."""
    row = Model.objects.filter(name=entry.name).first()
    if not is_remote(entry.source):
        facts = shape_facts(entry.source)  # a header on this machine: read at once
    elif row is not None and row.file_shape.get("source") == entry.source:
        facts = row.file_shape
    else:
        facts = {"source": entry.source, "reading": "its header is read once applied"}
    return Model(name=entry.name, source=entry.source, sha256=entry.sha256, file_shape=facts)


def _replaced_and_new(model: str, unsaved: Profile, newest: dict[str, str]) -> tuple[int, int]:
    """For a changed profile: how many running replicas its new settings replace, and how
    many new replicas start now (surge ones beside the old, or more wanted)."""
    current = Profile.objects.select_related("model").get(model__name=model, name=unsaved.name)
    running = Replica.objects.filter(profile=current, state__in=ReplicaState.COUNTED).count()
    if current.fingerprint(newest) != unsaved.fingerprint(newest):
        # A rolling restart starts surge new replicas at once (or replaces in place).
        at_once = unsaved.rollout_surge or unsaved.rollout_unavailable
        return running, max(min(unsaved.replicas, at_once), unsaved.replicas - running)
    return 0, max(0, unsaved.replicas - running)
