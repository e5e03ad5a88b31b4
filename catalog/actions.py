"""Verbs that change the catalog: apply a file or one model from a page, create, update or
delete one entry, scale a profile, pause a model's rollout, create and revoke API keys.

Each verb is one transaction that records its Event (naming the operator who asked) and
tells routers and open pages once it commits. The REST API, `llmgw_ctl` and the pages call
these and never save catalog rows themselves.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from datetime import datetime
from functools import partial
from typing import Any

from celery import current_app
from django.db import IntegrityError, models, transaction
from django.utils import timezone
from kombu.exceptions import OperationalError

from audit import notices
from audit.actors import Actor, SystemActor
from audit.events import record_event
from audit.models import EventKind
from catalog.engine_admin import check_planned, check_row
from catalog.fit.model_files import is_remote, shape_facts
from catalog.keys import (
    KEY_START,
    ApiKeyRefused,
    check_limits,
    check_priority,
    find_key,
    hash_key,
    key_limits,
    key_prefix,
    known_model_names,
)  # fmt: skip
from catalog.models import ApiKey, Engine, Fabric, Model, Pool, Profile
from catalog.plan import (
    MODEL_FIELDS,
    Change,
    check_references,
    plan_changes,
    profile_values,
)
from catalog.schema import CatalogError, CatalogFile, ModelEntry, parse_catalog

ENTRY_KINDS: dict[type[models.Model], str] = {
    Engine: "engine",
    Pool: "pool",
    Fabric: "fabric",
    Model: "model",
    Profile: "profile",
}
DELETABLE_BY_NAME = {"model": Model, "pool": Pool, "fabric": Fabric}
# Reads a model's file for its shape, in a task (catalog/fit/tasks.py) or at apply.
MODEL_FILE_READER = SystemActor("model file reader")
READ_MODEL_FILE_TASK = "catalog.read_model_file"


def _catalog_changed(subject: str, reason: str, actor: Actor) -> None:
    """Record a catalog change and tell routers: names, aliases and wanted counts change
    what they serve, and they should learn it now, not at their next refresh."""
    record_event(EventKind.CATALOG, subject, reason, actor=actor)
    notices.routers_reload_on_commit("catalog")


def apply_catalog(
    text: str,
    filename: str = "catalog.yaml",
    *,
    dry_run: bool = False,
    prune: bool = False,
    actor: Actor,
) -> list[Change]:
    """Make the catalog match the file; return the changes (made, or only planned if dry_run)."""
    catalog = parse_catalog(text, filename)
    with transaction.atomic():
        check_references(catalog, filename, prune=prune)
        changes = plan_changes(catalog, prune=prune)
        check_planned(changes, catalog, filename, actor)
        if not dry_run:
            for change in changes:
                _make_change(change, catalog)
            if changes:
                _catalog_changed(
                    filename, f"applied {len(changes)} change(s) from {filename}", actor
                )
            # Every model the file names, changed or not: one applied before llmgw read
            # model files, or a local file replaced in place, gets its estimate now.
            for model in Model.objects.filter(name__in=[m.name for m in catalog.models]):
                learn_model_shape(model, actor=actor)
    return changes


def _make_change(change: Change, catalog: CatalogFile) -> None:
    """One planned change, as apply_catalog makes it inside its transaction."""
    if change.kind == "engine":
        name, version = change.name.split(" ", 1)
        if change.action == "delete":
            Engine.objects.filter(name=name, version=version).delete()
            return
        entry = next(e for e in catalog.engines if (e.name, e.version) == (name, version))
        Engine.objects.update_or_create(
            name=name,
            version=version,
            defaults={"builds": [build.model_dump() for build in entry.builds]},
        )
    elif change.kind in ("pool", "fabric"):
        model_class = Pool if change.kind == "pool" else Fabric
        if change.action == "delete":
            model_class.objects.filter(name=change.name).delete()
            return
        entries = catalog.pools if change.kind == "pool" else catalog.fabrics
        named = next(e for e in entries if e.name == change.name)
        model_class.objects.update_or_create(
            name=named.name, defaults={"description": named.description}
        )
    elif change.kind == "model":
        if change.action == "delete":
            Model.objects.filter(name=change.name).delete()
            return
        described = next(m for m in catalog.models if m.name == change.name)
        model, _created = Model.objects.update_or_create(
            name=described.name,
            defaults={name: getattr(described, name) for name in MODEL_FIELDS},
        )
        learn_model_shape(model, actor=MODEL_FILE_READER)
    elif change.kind == "profile":
        model_name, profile_name = change.name.rsplit("/", 1)
        if change.action == "delete":
            Profile.objects.filter(model__name=model_name, name=profile_name).delete()
            return
        model_entry = next(m for m in catalog.models if m.name == model_name)
        profile_entry = next(p for p in model_entry.profiles if p.name == profile_name)
        defaults = profile_values(profile_entry)
        if change.action == "update" and profile_entry.autoscale is not None:
            defaults.pop("replicas")  # the reconciler's to set; an edit of args keeps it
        Profile.objects.update_or_create(
            model=Model.objects.get(name=model_name), name=profile_name, defaults=defaults
        )


def save_entry(row: models.Model, *, changed: Iterable[str] = (), actor: Actor):
    """Save one engine, pool, fabric, model or profile, new or changed (``changed`` names
    the fields, for the Event); an unchanged existing row records nothing."""
    kind = ENTRY_KINDS[type(row)]
    creating = row._state.adding
    changed = sorted(changed)
    with transaction.atomic():
        check_row(row, actor)
        row.save()
        if isinstance(row, Model):
            learn_model_shape(row, actor=actor)
        if creating:
            _catalog_changed(f"{kind}/{row}", f"created {kind} {row}", actor)
        elif changed:
            _catalog_changed(f"{kind}/{row}", f"updated {kind} {row}: {', '.join(changed)}", actor)
    return row


def update_entry(row: models.Model, fields: dict[str, Any], *, actor: Actor):
    """Change one entry's fields (already validated)."""
    changed = [name for name, value in fields.items() if getattr(row, name) != value]
    for name, value in fields.items():
        setattr(row, name, value)
    return save_entry(row, changed=changed, actor=actor)


def delete_row(row: models.Model, *, actor: Actor) -> None:
    """Delete one entry (a model takes its profiles with it)."""
    kind = ENTRY_KINDS[type(row)]
    with transaction.atomic():
        name = str(row)
        row.delete()
        _catalog_changed(f"{kind}/{name}", f"deleted {kind} {name}", actor)


def delete_entry(kind: str, name: str, *, actor: Actor) -> bool:
    """Delete one model, pool or fabric by name; return whether it existed."""
    model_class = DELETABLE_BY_NAME.get(kind)
    if model_class is None:
        raise CatalogError([f"cannot delete a {kind!r}; use model, pool or fabric"])
    with transaction.atomic():
        row = model_class._default_manager.filter(name=name).first()
        if row is None:
            return False
        delete_row(row, actor=actor)
    return True


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
            _catalog_changed(str(profile), reason, actor)
    return previous


def mark_low_demand_since(profile_id: int, since: datetime | None, *, actor: Actor) -> None:
    """Remember since when an autoscaled profile's demand has stayed below what its count
    needs (None: it has not), so a scale-down waits out ``scale_down_after`` across passes.

    Bookkeeping, not a decision: no Event; the scaling it leads to records one.
    """
    Profile.objects.filter(id=profile_id).update(autoscale_low_since=since)


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


def create_key(
    name: str,
    allowed_models: Iterable[str] = (),
    *,
    limits: dict[str, int | None] | None = None,
    expires_at: datetime | None = None,
    priority: str = "normal",
    actor: Actor,
) -> tuple[ApiKey, str]:
    """Create a key for ``name``; return the row and the key, which is never shown again.

    ``allowed_models`` limits the key to those models (names or aliases); empty allows
    every model. Names the catalog does not know are refused, so a typo cannot leave a
    key that silently works for nothing. ``limits`` are enforced by the routers together.
    """
    name = name.strip()
    if not name:
        raise ApiKeyRefused("a key needs a name saying who or what uses it")
    allowed = _known_models(allowed_models)
    checked = check_limits(limits or {})
    check_priority(priority)
    if expires_at is not None and expires_at <= timezone.now():
        raise ApiKeyRefused("expires: the key would be expired already; give a future time")
    for _attempt in range(5):
        key = KEY_START + secrets.token_urlsafe(32)
        try:
            with transaction.atomic():
                row = ApiKey.objects.create(
                    name=name,
                    prefix=key_prefix(key),
                    hashed_key=hash_key(key),
                    allowed_models=allowed,
                    expires_at=expires_at,
                    priority=priority,
                    **checked,
                )
                scope = ", ".join(allowed) or "every model"
                record_event(
                    EventKind.KEY, row.prefix, f"created for {name} ({scope}){_terms(row)}",
                    actor=actor,
                )  # fmt: skip
                notices.routers_reload_on_commit("keys")
        except IntegrityError:
            continue  # two keys drew the same prefix; draw again
        return row, key
    raise ApiKeyRefused("could not draw a unique key prefix; try again")


UNCHANGED: Any = object()


def update_key(
    identity: str,
    *,
    allowed_models: Iterable[str] | None = None,
    limits: dict[str, int | None] | None = None,
    expires_at: datetime | None = UNCHANGED,
    priority: str | None = None,
    actor: Actor,
) -> ApiKey:
    """Change a key's models, limits (None clears one), expiry or priority; routers apply
    it within a second. A revoked key is refused: nothing set on it would ever apply."""
    checked = check_limits(limits or {})
    if priority is not None:
        check_priority(priority)
    allowed = _known_models(allowed_models) if allowed_models is not None else None
    with transaction.atomic():
        row = ApiKey.objects.select_for_update().get(id=find_key(identity).id)
        if row.revoked_at is not None:
            raise ApiKeyRefused(
                f"key {row.prefix}… ({row.name}) is revoked; limits on it would never apply. "
                "Create a new key instead."
            )
        changes: dict[str, Any] = {**checked}
        if allowed is not None:
            changes["allowed_models"] = allowed
        if expires_at is not UNCHANGED:
            changes["expires_at"] = expires_at
        if priority is not None:
            changes["priority"] = priority
        changed = [f for f, value in changes.items() if getattr(row, f) != value]
        if changed:
            for field, value in changes.items():
                setattr(row, field, value)
            row.save(update_fields=changed)
            record_event(
                EventKind.KEY, row.prefix,
                f"updated {', '.join(changed)} of {row.name}'s key{_terms(row)}", actor=actor,
            )  # fmt: skip
            notices.routers_reload_on_commit("keys")
    return row


def _known_models(allowed_models: Iterable[str]) -> list[str]:
    allowed = sorted({m.strip() for m in allowed_models if m.strip()})
    unknown = sorted(set(allowed) - known_model_names())
    if unknown:
        known = ", ".join(sorted(known_model_names())) or "none"
        raise ApiKeyRefused(
            f"unknown model(s) {', '.join(unknown)}; the catalog has: {known}. "
            "Apply the model first, or fix the name."
        )
    return allowed


def _terms(row: ApiKey) -> str:
    """A key's limits, expiry and priority in an Event's words; "" when it has none."""
    terms = [
        f"{value} {name.replace('_', ' ')}" for name, value in key_limits(row).as_dict().items()
    ]
    if row.expires_at is not None:
        terms.append(f"expires {row.expires_at:%Y-%m-%d %H:%M} UTC")
    if row.priority != "normal":
        terms.append(f"priority {row.priority}")
    return f": {', '.join(terms)}" if terms else ""


def revoke_key(prefix: str, *, actor: Actor) -> ApiKey:
    """Revoke the key with this prefix (or this whole key); routers refuse it within a second."""
    prefix = key_prefix(prefix.strip())
    with transaction.atomic():
        row = ApiKey.objects.select_for_update().filter(prefix=prefix).first()
        if row is None:
            raise ApiKeyRefused(f"no key with prefix {prefix!r}; `llmgw_ctl keys list` shows them")
        if row.revoked_at is None:
            row.revoked_at = timezone.now()
            row.save(update_fields=["revoked_at"])
            record_event(EventKind.KEY, row.prefix, f"revoked (it was {row.name}'s)", actor=actor)
            notices.routers_reload_on_commit("keys")
    return row


def apply_model(
    entry: ModelEntry, *, creating: bool, dry_run: bool = False, actor: Actor
) -> list[Change]:
    """Create one model (``creating``) or make an existing one match ``entry``, as a page's
    form describes it; return the changes (made, or only planned if dry_run).

    The same plan as a catalog file's, so the form and the file cannot disagree: a model's
    profiles are its whole description, and a profile ``entry`` omits is deleted. Creating
    refuses a name or alias the catalog already serves, so a form never overwrites a model
    it did not show.
    """
    catalog = CatalogFile(models=[entry])
    with transaction.atomic():
        if creating:
            _refuse_names_taken(entry)
        elif not Model.objects.filter(name=entry.name).exists():
            raise CatalogError([f"name: no model is named {entry.name!r} any more"])
        check_references(catalog, entry.name, prune=False)
        changes = plan_changes(catalog, prune=False)
        check_planned(changes, catalog, entry.name, actor)
        if not dry_run and changes:
            for change in changes:
                _make_change(change, catalog)
            done = "created" if creating else "changed"
            described = ", ".join(change.describe() for change in changes)
            _catalog_changed(entry.name, f"{done} from the pages: {described}", actor)
    return changes


def _refuse_names_taken(entry: ModelEntry) -> None:
    served_by: dict[str, str] = {}
    for name, aliases in Model.objects.values_list("name", "aliases"):
        served_by.update(dict.fromkeys([name, *aliases], name))
    problems = [
        f"{field}: {name!r} is already served by model {served_by[name]!r}; pick another "
        f"name, or change {served_by[name]!r} from its page"
        for field, names in (("name", [entry.name]), ("aliases", entry.aliases))
        for name in names
        if name in served_by
    ]
    if problems:
        raise CatalogError(problems)


def learn_model_shape(model: Model, *, actor: Actor) -> None:
    """Find out what the model's file says about the memory it needs (``Model.shape``).

    A local file is read now: its header takes milliseconds, and may have been replaced in
    place, so it is read at every apply. A URL or hub id is read by a task once this
    transaction commits (a download never holds up a request), and only until it is known.
    """
    source = model.source
    if not is_remote(source):
        record_model_shape(model.id, source, shape_facts(source), actor=actor)
        return
    if model.shape() is not None or model.shape_note("reading"):
        return
    reading = {"source": source, "reading": f"its header at {source} is being read"}
    Model.objects.filter(id=model.id).update(file_shape=reading)
    model.file_shape = reading
    transaction.on_commit(partial(_ask_to_read, model.id, source))


def _ask_to_read(model_id: int, source: str) -> None:
    try:
        current_app.send_task(READ_MODEL_FILE_TASK, args=[model_id, source], queue="control")
    except OperationalError as err:
        # No broker: say so instead of waiting for a read nobody will do; apply retries.
        facts = {"source": source, "unreadable": f"no worker could be asked to read it: {err}"}
        record_model_shape(model_id, source, facts, actor=MODEL_FILE_READER)


def record_model_shape(model_id: int, source: str, facts: dict[str, Any], *, actor: Actor) -> bool:
    """Keep what was read of a model's file (``shape_facts``), unless its source changed
    meanwhile; record an Event when the estimate appears, or a download could not make it."""
    with transaction.atomic():
        model = Model.objects.select_for_update().filter(id=model_id, source=source).first()
        if model is None or model.file_shape == facts:
            return False
        Model.objects.filter(id=model.id).update(file_shape=facts)
        model.file_shape = facts
        shape = model.shape()
        if shape is not None:
            reason = f"read its file: {shape.describe()}"
        elif model.shape_note("unreadable") and is_remote(source):
            # A local path unreadable here is the rule (the nodes hold the files), not news.
            reason = f"cannot estimate its memory: {model.shape_note('unreadable')}"
        else:
            return True
        record_event(EventKind.CATALOG, model.name, reason, actor=actor)
    return True
