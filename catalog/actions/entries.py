"""Verbs on catalog entries: apply a catalog file, or one model as a page's form describes
it; save, update or delete one engine, pool, fabric, model or profile.

A file and a form make the same plan (``catalog.plan``), so they cannot disagree.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db import models, transaction

from audit.actors import Actor
from catalog.actions.changes import catalog_changed
from catalog.actions.shapes import MODEL_FILE_READER, learn_model_shape
from catalog.engine_admin import check_planned, check_row
from catalog.models import Engine, Fabric, Model, Pool, Profile
from catalog.plan import (
    Change,
    check_references,
    model_values,
    plan_changes,
    profile_values,
)
from catalog.schema import AdapterEntry, CatalogError, CatalogFile, ModelEntry, parse_catalog

ENTRY_KINDS: dict[type[models.Model], str] = {
    Engine: "engine",
    Pool: "pool",
    Fabric: "fabric",
    Model: "model",
    Profile: "profile",
}
DELETABLE_BY_NAME = {"model": Model, "pool": Pool, "fabric": Fabric}


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
                catalog_changed(
                    filename, f"applied {len(changes)} change(s) from {filename}", actor=actor
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
            defaults=model_values(described),
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
    if not creating and "adapters" not in entry.model_fields_set:
        # A form that shows no adapters keeps the model's: it describes what it shows.
        kept = Model.objects.filter(name=entry.name).values_list("adapters", flat=True).first()
        entry = entry.model_copy(update={"adapters": [AdapterEntry(**a) for a in kept or []]})
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
            catalog_changed(entry.name, f"{done} from the pages: {described}", actor=actor)
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
            catalog_changed(f"{kind}/{row}", f"created {kind} {row}", actor=actor)
        elif changed:
            catalog_changed(
                f"{kind}/{row}", f"updated {kind} {row}: {', '.join(changed)}", actor=actor
            )
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
        catalog_changed(f"{kind}/{name}", f"deleted {kind} {name}", actor=actor)


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
