"""Verbs on a profile's count and a model's rollout: scale a profile (an operator, or the
autoscaler), note since when its demand has been low, pause and resume a rolling restart,
pin profiles to the engine versions their replicas run."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from django.db import transaction

from audit.actors import Actor
from audit.events import record_event, record_news
from audit.models import EventKind
from catalog.actions.changes import catalog_changed
from catalog.models import Engine, Model, Profile, default_engines
from protocol.units import format_duration


def scale_profile(profile_id: int, replicas: int, *, why: str = "", actor: Actor) -> int | None:
    """Set how many replicas a profile wants; return the previous count (None: no profile).

    The catalog file still says what it said: the next ``apply`` of that file sets the
    count back, which is what an operator who keeps the catalog in git wants. ``why``
    is the Event's reason when the autoscaler decided it.
    """
    if replicas < 0:
        raise ValueError(f"a profile cannot want {replicas} replicas; use 0 or more")
    with transaction.atomic():
        locked = Profile.objects.select_for_update().select_related("model")
        profile = locked.filter(id=profile_id).first()
        if profile is None:
            return None
        previous = profile.replicas
        if previous != replicas:
            Profile.objects.filter(id=profile_id).update(replicas=replicas)
            reason = why or f"scaled from {previous} to {replicas} replicas"
            catalog_changed(str(profile), reason, actor=actor)
    return previous


def mark_low_demand_since(profile_id: int, since: datetime | None, *, actor: Actor) -> None:
    """Remember since when an autoscaled profile's demand has stayed below what its count
    needs (None: it has not), so a scale-down waits out ``scale_down_after`` across passes.

    When demand first falls low, say that a scale-down is coming: once, not at every pass,
    and not again while demand hovers about the target (``record_news``).
    """
    with transaction.atomic():
        fell_low = since is not None and Profile.objects.filter(
            id=profile_id, autoscale_low_since=None
        ).update(autoscale_low_since=since)
        if not fell_low:
            Profile.objects.filter(id=profile_id).update(autoscale_low_since=since)
            return
        profile = Profile.objects.select_related("model").get(id=profile_id)
        after = format_duration(int((profile.autoscale or {}).get("scale_down_after", 0)))
        record_news(
            EventKind.CATALOG, str(profile),
            f"demand is under what its {profile.replicas} replica(s) need: one fewer if it "
            f"stays so for {after}",
            actor=actor,
        )  # fmt: skip


def pause_rollout(model_name: str, *, actor: Actor) -> bool:
    """Stop replacing ``model_name``'s stale replicas until resumed; False if already paused.

    A drain already begun still ends (that replica serves nothing any more); nothing new
    is started or drained. Held in the database, so applying the catalog never lifts it.
    """
    return _set_rollout_paused(model_name, True, "rollout paused", actor)


def resume_rollout(model_name: str, *, actor: Actor) -> bool:
    """Let ``model_name``'s rolling restarts go on; False if they were not paused."""
    return _set_rollout_paused(model_name, False, "rollout resumed", actor)


def _set_rollout_paused(model_name: str, paused: bool, why: str, actor: Actor) -> bool:
    with transaction.atomic():
        changed = Model.objects.filter(name=model_name, rollout_paused=not paused).update(
            rollout_paused=paused
        )
        if changed:
            record_event(EventKind.CATALOG, model_name, why, actor=actor)
    return bool(changed)


def pin_engine_versions(pins: Mapping[int, str], *, actor: Actor) -> list[str]:
    """Pin each profile of ``pins`` (id -> version) that is not pinned yet to that engine
    version, the one its replicas run, so that neither a version added to the catalog nor
    a control plane upgraded with a newer default build restarts them; return each pinned,
    as "model/profile: engine version".

    A default build the catalog does not name is declared in ``engines:`` as llmgw ships
    it now, or an upgrade would stop telling nodes to keep it. One transaction, an Event a
    change; ``llmgw_ctl export`` then writes the pins into the file.
    """
    pinned = []
    with transaction.atomic():
        profiles = Profile.objects.select_for_update().select_related("model")
        for profile in profiles.filter(id__in=list(pins), engine_version="").order_by("id"):
            version = pins[profile.id]
            _declare_default(profile.engine, version, actor)
            Profile.objects.filter(id=profile.id).update(engine_version=version)
            said = f"{profile.engine} {version}"
            catalog_changed(str(profile), f"engine_version pinned to {said}, the version its "
                            "replicas run", actor=actor)  # fmt: skip
            pinned.append(f"{profile}: {said}")
    return pinned


def _declare_default(engine: str, version: str, actor: Actor) -> None:
    default = next((d for d in default_engines([]) if d.key == (engine, version)), None)
    if default is None or Engine.objects.filter(name=engine, version=version).exists():
        return
    builds = [build.model_dump() for build in default.builds]
    Engine.objects.create(name=engine, version=version, builds=builds)
    why = (f"declared {engine} {version} in engines: as llmgw's default build, to keep it "
           "once the default changes")  # fmt: skip
    catalog_changed(f"{engine} {version}", why, actor=actor)
