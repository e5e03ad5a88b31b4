"""What applying a catalog file would change, and the catalog written back as a file.

``plan_changes`` works out every change first (a plan a person can read), and
``catalog.actions.entries.apply_catalog`` then makes them all in one transaction, so a refused
file leaves nothing half-applied. Nothing here writes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from catalog.fit.model_files import is_remote, shape_facts
from catalog.models import (
    Engine,
    Fabric,
    Model,
    Pool,
    Profile,
    newest_by_engine,
    newest_engine_versions,
)
from catalog.schema import (
    AdapterEntry,
    CatalogError,
    CatalogFile,
    ModelEntry,
    ProfileEntry,
    RolloutEntry,
)
from protocol.engines import DEFAULT_LLAMA_CPP, is_default
from protocol.units import format_duration, format_size

PROFILE_FIELDS = (
    "engine", "engine_version", "replicas", "gpus_per_rank", "tensor_parallel", "nodes",
    "memory", "gpu_memory", "disk", "context", "pool", "launch_mode", "strategy", "serves",
    "args", "env", "startup_timeout", "drain_timeout", "routing", "concurrency", "autoscale",
    "max_loras", "max_lora_rank",
)  # fmt: skip
# The file's ``rollout:`` block is two columns of the profile row.
ROLLOUT_COLUMNS = {"rollout_surge": "surge", "rollout_unavailable": "unavailable"}
MODEL_FIELDS = ("source", "sha256", "aliases", "description", "adapters")
SIZE_FIELDS = {"memory", "gpu_memory", "disk"}
DURATION_FIELDS = {"startup_timeout", "drain_timeout"}


@dataclass
class Change:
    """One thing apply would do: create, update or delete an entry."""

    action: str  # create | update | delete
    kind: str  # engine | pool | fabric | model | profile
    name: str
    fields: dict[str, tuple[Any, Any]] = field(default_factory=dict)

    def describe(self) -> str:
        sign = {"create": "+", "update": "~", "delete": "-"}[self.action]
        line = f"{sign} {self.kind} {self.name}"
        if self.fields:
            line += ": " + ", ".join(
                f"{name} {_show(name, old)} -> {_show(name, new)}"
                for name, (old, new) in self.fields.items()
            )
        return line


def _show(name: str, value: Any) -> str:
    if name in SIZE_FIELDS and isinstance(value, int):
        return format_size(value)
    return repr(value)


def check_references(catalog: CatalogFile, filename: str, *, prune: bool) -> None:
    pools = {pool.name for pool in catalog.pools}
    engines = _engines_after(catalog, prune=prune)
    if not prune:
        pools |= set(Pool.objects.values_list("name", flat=True))
    declared_engines = {name for name, _version in engines}
    newest = newest_by_engine(engines)
    problems = []
    for index, model in enumerate(catalog.models):
        for pindex, profile in enumerate(model.profiles):
            where = (
                f"{filename}: models[{index}] ({model.name}): profiles[{pindex}] ({profile.name})"
            )
            if profile.pool and profile.pool not in pools:
                problems.append(
                    f"{where}: pool: {profile.pool!r} is not declared; add it under pools:"
                )
            if (
                profile.engine_version
                and profile.engine in declared_engines
                and (profile.engine, profile.engine_version) not in engines
            ):
                known = sorted(v for n, v in engines if n == profile.engine)
                problems.append(
                    f"{where}: engine_version: {profile.engine} {profile.engine_version} is not "
                    f"declared; declared: {', '.join(known)}"
                )
            version = profile.engine_version or newest.get(profile.engine, "")
            spanning = spans_nodes_problem(profile.engine, version, profile.nodes)
            if spanning:
                problems.append(f"{where}: {spanning}")
    if problems:
        raise CatalogError(problems)


def plan_changes(catalog: CatalogFile, *, prune: bool) -> list[Change]:
    changes: list[Change] = []
    existing_engines = {(e.name, e.version): e for e in Engine.objects.all()}
    for entry in catalog.engines:
        builds = [build.model_dump() for build in entry.builds]
        engine = existing_engines.pop((entry.name, entry.version), None)
        name = f"{entry.name} {entry.version}"
        if engine is None:
            changes.append(Change("create", "engine", name))
        elif engine.builds != builds:
            changes.append(Change("update", "engine", name, {"builds": (engine.builds, builds)}))
    if prune:
        changes += [Change("delete", "engine", f"{n} {v}") for n, v in existing_engines]

    for kind, model_class, entries in (
        ("pool", Pool, catalog.pools),
        ("fabric", Fabric, catalog.fabrics),
    ):
        existing = {row.name: row for row in model_class.objects.all()}
        for named in entries:
            row = existing.pop(named.name, None)
            if row is None:
                changes.append(Change("create", kind, named.name))
            elif row.description != named.description:
                changes.append(
                    Change(
                        "update",
                        kind,
                        named.name,
                        {"description": (row.description, named.description)},
                    )
                )
        if prune:
            changes += [Change("delete", kind, name) for name in existing]

    newest = (newest_engine_versions(), _newest_after(catalog, prune=prune))
    existing_models = {m.name: m for m in Model.objects.prefetch_related("profiles")}
    for model_entry in catalog.models:
        model = existing_models.pop(model_entry.name, None)
        wanted = model_values(model_entry)
        if model is None:
            changes.append(Change("create", "model", model_entry.name))
            changes += [
                Change("create", "profile", f"{model_entry.name}/{profile.name}")
                for profile in model_entry.profiles
            ]
            continue
        differ = _differences(model, wanted)
        if differ:
            changes.append(Change("update", "model", model_entry.name, differ))
        profiles = {profile.name: profile for profile in model.profiles.all()}
        for profile_entry in model_entry.profiles:
            profile = profiles.pop(profile_entry.name, None)
            name = f"{model_entry.name}/{profile_entry.name}"
            if profile is None:
                changes.append(Change("create", "profile", name))
                continue
            wanted_values = profile_values(profile_entry)
            if profile_entry.autoscale is not None:
                # An autoscaled profile's count is the reconciler's, not the file's.
                wanted_values.pop("replicas")
            differ = {
                _label(name): values
                for name, values in _differences(profile, wanted_values).items()
            }
            differ.update(_newest_version_change(profile, profile_entry, *newest))
            if differ:
                changes.append(Change("update", "profile", name, differ))
        # A model's profiles are its whole description: a profile the file drops is gone.
        changes += [Change("delete", "profile", f"{model_entry.name}/{name}") for name in profiles]
    if prune:
        changes += [Change("delete", "model", name) for name in existing_models]
    return changes


def fit_lines(catalog: CatalogFile) -> list[str]:
    """Each profile's memory estimate from its model's file, or why there is none, and a
    warning for each declared size below it. Reads local files' headers; writes nothing."""
    rows = {
        row.name: row for row in Model.objects.filter(name__in=[m.name for m in catalog.models])
    }
    lines = []
    for entry in catalog.models:
        row = rows.get(entry.name)
        if not is_remote(entry.source):
            facts = shape_facts(entry.source)  # what apply will store
        elif row is not None and row.file_shape.get("source") == entry.source:
            facts = row.file_shape
        else:
            facts = {"source": entry.source, "reading": "its header is read once applied"}
        model = Model(name=entry.name, source=entry.source, file_shape=facts)
        for profile_entry in entry.profiles:
            profile = Profile(model=model, name=profile_entry.name, **profile_values(profile_entry))
            name = f"{entry.name}/{profile.name}"
            if profile.fit_line:
                lines.append(f"  {name}: {profile.fit_line}")
            lines += [f"warning: {name}: {warning}" for warning in profile.needs().warnings]
    return lines


# llama.cpp's own words (tools/rpc/README.md), then what llmgw does and what it leaves.
RPC_WARNING = (
    "warning: {profiles}: llama.cpp across nodes runs rpc-server on the workers, which has "
    "no authentication and runs any tensor operation it is sent; llama.cpp says: never run "
    "the RPC server on an open network or in a sensitive environment. llmgw binds each "
    "worker's rpc-server to its fabric's own address where the fabric has one, and each "
    "node's nftables admit only rank 0's addresses to it (a node that cannot keep those "
    "walls takes no such replica). Keeping the nodes' and the fabric's networks to the "
    "fleet alone, and llama.cpp up to date, remains the operator's job."
)


def across_nodes_lines(catalog: CatalogFile) -> list[str]:
    """llama.cpp's warning, once, when a profile splits a llama.cpp replica over nodes."""
    split = [
        f"{model.name}/{profile.name}"
        for model in catalog.models
        for profile in model.profiles
        if profile.engine == "llama.cpp" and profile.nodes > 1
    ]
    return [RPC_WARNING.format(profiles=", ".join(split))] if split else []


def resolver_after(catalog: CatalogFile, *, prune: bool) -> Callable[[Profile], str | None]:
    """The engine version each profile will resolve to once the file is applied (None for
    one the file removes): the file's pin, else the newest the catalog will name."""
    newest = _newest_after(catalog, prune=prune)
    entries = {(m.name, p.name): p for m in catalog.models for p in m.profiles}
    described = {m.name for m in catalog.models}

    def resolve(profile: Profile) -> str | None:
        entry = entries.get((profile.model.name, profile.name))
        if entry is not None:
            return entry.engine_version or newest.get(entry.engine, "")
        if prune or profile.model.name in described:
            return None  # a model's profiles are its whole description
        return profile.engine_version or newest.get(profile.engine, "")

    return resolve


def _newest_after(catalog: CatalogFile, *, prune: bool) -> dict[str, str]:
    """Engine name -> the newest version the catalog will name once the file is applied
    (a default's for an engine it will name none of)."""
    return newest_by_engine(_engines_after(catalog, prune=prune))


def _engines_after(catalog: CatalogFile, *, prune: bool) -> set[tuple[str, str]]:
    versions = {(engine.name, engine.version) for engine in catalog.engines}
    if not prune:
        versions |= set(Engine.objects.values_list("name", "version"))
    return versions


def _newest_version_change(
    profile: Profile, entry: ProfileEntry, before: dict[str, str], after: dict[str, str]
) -> dict[str, tuple[str, str]]:
    """An unpinned profile runs its engine's newest version in the catalog: an engine
    version added or dropped changes what it runs (a rolling restart), so say so."""
    if entry.engine_version:
        return {}  # pinned: its own engine_version line says what changes
    old, new = profile.resolved_engine_version(before), after.get(entry.engine, "")
    if old == new:
        return {}
    if is_default(entry.engine, new):
        return {f"engine_version (llmgw's default {entry.engine})": (old, new)}
    return {f"engine_version (the catalog's newest {entry.engine})": (old, new)}


def model_values(entry: ModelEntry) -> dict[str, Any]:
    """The model row's columns as the file's entry sets them (adapters as plain dicts)."""
    values = {name: getattr(entry, name) for name in MODEL_FIELDS}
    values["adapters"] = [adapter.model_dump() for adapter in entry.adapters]
    return values


def profile_values(entry: ProfileEntry) -> dict[str, Any]:
    """The profile row's columns as the file's entry sets them."""
    values = {name: getattr(entry, name) for name in PROFILE_FIELDS}
    values.update({column: getattr(entry.rollout, key) for column, key in ROLLOUT_COLUMNS.items()})
    if entry.autoscale is not None:
        values["autoscale"] = entry.autoscale.model_dump()
        values["replicas"] = entry.autoscale.min  # where it starts; then demand decides
    return values


def _label(column: str) -> str:
    """A column as the file names it (``rollout.surge``), for the plan a person reads."""
    return f"rollout.{ROLLOUT_COLUMNS[column]}" if column in ROLLOUT_COLUMNS else column


def _differences(row: Any, wanted: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    return {
        name: (getattr(row, name), value)
        for name, value in wanted.items()
        if getattr(row, name) != value
    }


def export_catalog() -> dict[str, Any]:
    """The catalog in the file format, leaving out values that equal the defaults."""
    data: dict[str, Any] = {}
    engines = [
        {"name": e.name, "version": e.version, **({"builds": e.builds} if e.builds else {})}
        for e in Engine.objects.all()
    ]
    if engines:
        data["engines"] = engines
    for key, model_class in (("pools", Pool), ("fabrics", Fabric)):
        rows = [
            {"name": row.name, **({"description": row.description} if row.description else {})}
            for row in model_class.objects.all()
        ]
        if rows:
            data[key] = rows
    models = []
    for model in Model.objects.prefetch_related("profiles"):
        entry: dict[str, Any] = {"name": model.name, "source": model.source}
        for name in ("sha256", "aliases", "description"):
            value = getattr(model, name)
            if value != ModelEntry.model_fields[name].default:
                entry[name] = value
        if model.adapters:
            entry["adapters"] = [_exported_adapter(adapter) for adapter in model.adapters]
        profiles = []
        for profile in model.profiles.all():
            item: dict[str, Any] = {"name": profile.name, "engine": profile.engine}
            for name in PROFILE_FIELDS[1:]:
                value = getattr(profile, name)
                if value == ProfileEntry.model_fields[name].default:
                    continue
                if name in SIZE_FIELDS:
                    value = format_size(value)
                elif name in DURATION_FIELDS:
                    value = format_duration(value)
                item[name] = value
            if profile.rollout != RolloutEntry().model_dump():
                item["rollout"] = profile.rollout
            profiles.append(item)
        if profiles:
            entry["profiles"] = profiles
        models.append(entry)
    if models:
        data["models"] = models
    return data


def _exported_adapter(adapter: dict[str, Any]) -> dict[str, Any]:
    """One adapter as the file writes it: its name and source, then what is not a default."""
    fields = AdapterEntry.model_fields
    return {
        name: value
        for name, value in adapter.items()
        if name in ("name", "source") or (name in fields and value != fields[name].default)
    }


def spans_nodes_problem(engine: str, version: str, nodes: int) -> str | None:
    """Why a profile over ``nodes`` nodes cannot run on ``engine`` ``version`` when that is
    the prebuilt default llama.cpp (no RPC backend); None when it can, or is not it."""
    if nodes <= 1 or (engine, version) != DEFAULT_LLAMA_CPP.key:
        return None
    return (
        f"nodes: {nodes} splits the model over llama.cpp's RPC backend, which the default "
        f"llama.cpp ({version}, prebuilt from PyPI) does not have; pin engine_version: to a "
        "llama.cpp build with rpc-server (one named under engines:, or one the agent files "
        "name: `make engines` builds one from source), or set nodes: 1"
    )
