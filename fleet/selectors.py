"""Reads that pages, the API and llmgw_ctl share."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any
from uuid import UUID

from django.db import connection
from django.db.models import Count, Prefetch, Q
from django.utils import timezone

from audit.models import Event
from catalog.models import (
    FROM_CATALOG,
    FROM_DEFAULT,
    FROM_NODE,
    Model,
    engine_origins,
    newest_engine_versions,
)
from core.humanize import format_bytes, format_progress
from fleet.models import Node, NodeState, Replica, ReplicaState, Shard, without_reports
from fleet.planning.backoff import replacement_backoffs
from fleet.traffic import buckets
from protocol.engines import EngineInstall, is_default
from protocol.inventory import Filesystem, Inventory, NodeUsage
from protocol.serving import DEFAULT_SERVES
from protocol.shard import adapter_id, loras_of


def live_replicas():
    """Replicas that are not yet stopped, with their shards, ordered for display; each
    shard's node without its reports (kilobytes of JSON a node, which no row shows)."""
    shards = Shard.objects.select_related("node").defer(*without_reports("node"))
    live = Replica.objects.filter(state__in=ReplicaState.LIVE).select_related("profile__model")
    return live.prefetch_related(Prefetch("shards", queryset=shards.order_by("rank")))


def model_rows(page: int = 1, pages: int | None = None, per_page: int = 0) -> list[dict[str, Any]]:
    """For each catalog model: wanted and ready replicas, and the live replicas themselves.

    Given ``pages`` (of ``per_page`` models), only ``page`` of the catalog by name: the
    cluster page of a large catalog. Replicas whose model left the catalog come last.
    """
    models = Model.objects.prefetch_related("profiles").order_by("name")
    replicas = live_replicas()
    if pages is not None:
        models = models[(page - 1) * per_page : page * per_page]
        shown = Q(model_name__in=[model.name for model in models])
        if page >= pages:
            shown |= ~Q(model_name__in=Model.objects.values("name"))
        replicas = replicas.filter(shown)
    replicas_by_model: dict[str, list[Replica]] = {}
    for replica in replicas:
        replicas_by_model.setdefault(replica.model_name, []).append(replica)
    backoffs = backoff_lines([r for rs in replicas_by_model.values() for r in rs])
    rows = []
    newest = newest_engine_versions()
    for model in models:
        replicas = replicas_by_model.pop(model.name, [])
        fingerprints = {p.name: p.fingerprint(newest) for p in model.profiles.all()}
        rows.append(
            {
                "name": model.name,
                "aliases": model.aliases,
                "serves": model.served_kinds,
                "wanted": sum(p.replicas for p in model.profiles.all()),
                "ready": sum(1 for r in replicas if r.state == ReplicaState.READY),
                "replicas": [
                    replica_item(
                        r, backoffs, stale=not r.runs_settings(fingerprints.get(r.profile_name, ""))
                    )
                    for r in replicas
                ],
                "profiles": list(model.profiles.all()),
            }
        )
    # Replicas whose model left the catalog still show until they are stopped.
    for name, replicas in sorted(replicas_by_model.items()):
        rows.append(
            {
                "name": name,
                "aliases": [],
                "serves": list(DEFAULT_SERVES),
                "wanted": 0,
                "ready": sum(1 for r in replicas if r.state == ReplicaState.READY),
                "replicas": [replica_item(r, backoffs, stale=True) for r in replicas],
                "profiles": [],
            }
        )
    return rows


def model_pages(per_page: int) -> int:
    """How many pages of ``per_page`` the catalog's models fill (at least one)."""
    return max(1, -(-Model.objects.count() // per_page))


def replica_item(replica: Replica, backoffs: dict[UUID, str], *, stale: bool) -> dict[str, Any]:
    """A replica as pages show it: its shards with a progress line while downloading, and
    when a failed one is replaced (``backoffs``, from ``backoff_lines``)."""
    return {
        "replica": replica,
        "stale": stale,
        "backoff": backoffs.get(replica.id, ""),
        "shards": [
            {"shard": shard, "progress": progress_line(shard.progress)}
            for shard in replica.shards.all()
        ],
    }


def backoff_lines(replicas: list[Replica]) -> dict[UUID, str]:
    """For each failed replica of these, by id, when its replacement is due and why."""
    now = timezone.now()
    failed = [replica for replica in replicas if replica.state == ReplicaState.FAILED]
    return {pk: backoff.explain(now) for pk, backoff in replacement_backoffs(failed, now).items()}


def node_counts(where: Q | None = None) -> dict[str, int]:
    """How many nodes there are, in each state and draining, and how many ``where``
    picks ("matched"): one aggregate query, however many nodes."""
    wheres = {state: Q(state=state) for state in NodeState.values}
    wheres["draining"] = Q(draining=True)
    if where:
        wheres["matched"] = where
    # Aliases apart from the fields' names: an aggregate named "draining" would shadow
    # the field in the others' filters.
    aggregates = {f"n_{name}": Count("pk", filter=q) for name, q in wheres.items()}
    totals = Node.objects.aggregate(n_total=Count("pk"), **aggregates)
    counts = {alias.removeprefix("n_"): value for alias, value in totals.items()}
    counts.setdefault("matched", counts["total"])
    return counts


def node_window(where: Q | None = None, page: int = 1, per_page: int = 50) -> dict[str, Any]:
    """Page ``page`` of the nodes ``where`` picks (by id; past the last, the last), as
    rows, with the counts around it.

    Two queries whatever the fleet's size: the counts, then the page's rows. ``outline``
    says what decides the rows shown (the counts and the rows' ids): a change that leaves
    it as it was and touches no row shown changes nothing on the page.
    """
    now = timezone.now()
    counts = node_counts(where)
    page, pages = _within(page, counts["matched"], per_page)
    start = (page - 1) * per_page
    nodes = list(Node.objects.filter(where or Q()).order_by("id")[start : start + per_page])
    return {
        "nodes": [node_row(node, now) for node in nodes],
        "counts": counts,
        "window": {
            "first": start + 1 if nodes else 0,
            "last": start + len(nodes),
            "page": page,
            "pages": pages,
        },
        "outline": _outline(counts, [node.id for node in nodes]),
        "now": now,
    }


def node_rows(node_ids: Iterable[str], now: datetime) -> list[dict[str, Any]]:
    """The rows of these nodes (those that still exist), as ``node_window`` draws them: one
    query."""
    nodes = Node.objects.filter(id__in=list(node_ids)).order_by("id")
    return [node_row(node, now) for node in nodes]


def node_outline(where: Q | None = None, page: int = 1, per_page: int = 50) -> tuple:
    """``node_window``'s outline alone, read without the rows: two small queries."""
    counts = node_counts(where)
    page, _pages = _within(page, counts["matched"], per_page)
    start = (page - 1) * per_page
    ids = Node.objects.filter(where or Q()).order_by("id").values_list("id", flat=True)
    return _outline(counts, list(ids[start : start + per_page]))


def _within(page: int, matched: int, per_page: int) -> tuple[int, int]:
    """The page shown (1 to the last) and how many there are."""
    pages = max(1, -(-matched // per_page))
    return max(1, min(page, pages)), pages


def _outline(counts: dict[str, int], ids: list[str]) -> tuple:
    return tuple(sorted(counts.items())), tuple(ids)


def node_filter_choices() -> dict[str, list[str]]:
    """The pools and fabrics nodes are in, for a filter's choices: two queries that read
    no row into Python (a fabric is what a node's register said it can use)."""
    pools = Node.objects.exclude(pool="").order_by("pool").values_list("pool", flat=True)
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT DISTINCT fabric->>'name' FROM {Node._meta.db_table}, "  # noqa: S608
            "jsonb_array_elements(CASE WHEN jsonb_typeof(inventory->'fabrics') = 'array' "
            "THEN inventory->'fabrics' ELSE '[]'::jsonb END) AS fabric ORDER BY 1"
        )
        fabrics = [name for (name,) in cursor.fetchall() if name]
    return {"pools": list(pools.distinct()), "fabrics": fabrics}


def progress_line(progress: dict | None) -> str:
    """'3.1 of 15.2 GiB, 41 MiB/s' while downloading, '1.2 GiB so far' with no known size."""
    if not progress:
        return ""
    return format_progress(progress.get("bytes") or 0, progress.get("total"), progress.get("rate"))


def _percent(part: float | None, whole: float | None) -> float | None:
    if part is None or not whole:
        return None
    return max(0.0, min(100.0, 100.0 * part / whole))


def engine_row(
    install: EngineInstall, origins: Mapping[tuple[str, str], str] | None = None
) -> dict[str, Any]:
    """One engine version on a node, as pages, ``llmgw_ctl nodes --json`` and the API say it.

    ``origins`` (``engine_origins()``, read once for every row) adds where it came from;
    the cluster page, which shows no origin, reads no more for its thousands of rows."""
    return {
        "engine": install.engine,
        "version": install.version,
        "status": install.status,
        "managed": install.managed,
        "detail": install.detail,
        "words": install.words,
        "installed": install.installed,
        "origin": "" if origins is None else engine_origin(install, origins),
    }


def engine_origin(install: EngineInstall, origins: Mapping[tuple[str, str], str]) -> str:
    """Where a node's engine version came from: the default, the catalog, or the node itself
    (its agent file); an install llmgw made that nothing names any more says so."""
    if not install.managed:
        return FROM_NODE
    key = (install.engine, install.version)
    if key in origins:
        return origins[key]
    was = FROM_DEFAULT if is_default(*key) else FROM_CATALOG
    return f"{was}, no longer named (removed once no shard runs on it)"


def node_row(
    node: Node, now: datetime, origins: Mapping[tuple[str, str], str] | None = None
) -> dict[str, Any]:
    """A node as the cluster and node pages show it: its latest use against what it has
    (with ``origins``, where each engine version came from: the node page).

    Usage that is not fresh is still shown, marked stale, rather than hidden.
    """
    facts, usage = node.inventory_facts(), node.latest_usage()
    fresh = node.usage_fresh_at(now)
    memory_total = (usage.memory_total if usage else 0) or (facts.memory_total if facts else None)
    installs = node.engine_installs()
    engines = None if installs is None else [engine_row(i, origins) for i in installs]
    filesystems = (usage.filesystems if usage else []) or (facts.filesystems if facts else [])
    cpu_percent = usage.cpu_percent if usage else None
    memory_used = usage.memory_used if usage else None
    return {
        "node": node,
        "silence": node.silence(now),
        "heard_at": node.last_heartbeat or node.registered_at,
        "fresh": fresh,
        "stale": not fresh,
        "cores": facts.cpu.cores if facts else None,
        "cpu_model": facts.cpu.model if facts else "",
        "cpu_percent": cpu_percent,
        "load": list(usage.load) if usage else [],
        "memory_used": memory_used,
        "memory_total": memory_total,
        "memory_percent": _percent(memory_used, memory_total),
        "cpu_label": "" if cpu_percent is None else f"{cpu_percent:.0f}%",
        "memory_label": (
            ""
            if memory_used is None or not memory_total
            else f"{format_bytes(memory_used)} / {format_bytes(memory_total)}"
        ),
        "gpus": _gpu_rows(facts, usage),
        "engines": engines,
        "filesystems": [
            dict(fs.model_dump(), used_percent=_percent(fs.total - fs.free, fs.total))
            for fs in filesystems
        ],
        "disk_free": _disk_free(filesystems, facts.weights_dir if facts else ""),
        "warnings": node.warnings,
    }


def _gpu_rows(facts: Inventory | None, usage: NodeUsage | None) -> list[dict[str, Any]]:
    """Each GPU's memory in use: the latest heartbeat's, else what the register measured."""
    used_now = usage.gpu_memory_used if usage else {}
    rows = []
    for gpu in facts.gpus if facts else []:
        used = used_now.get(gpu.index, gpu.memory_used)
        rows.append(
            {
                "index": gpu.index,
                "name": gpu.name,
                "used": used,
                "total": gpu.memory_total,
                "percent": _percent(used, gpu.memory_total),
            }
        )
    return rows


def _disk_free(filesystems: list[Filesystem], weights_dir: str) -> int | None:
    """Free space where the weights go, else on the first filesystem measured."""
    weights_fs = next((fs for fs in filesystems if fs.path == weights_dir), None)
    chosen = weights_fs or (filesystems[0] if filesystems else None)
    return chosen.free if chosen else None


def node_detail(node_id: str) -> dict[str, Any] | None:
    """Everything the node page shows now: the node, and the shards placed on it."""
    node = Node.objects.filter(id=node_id).first()
    if node is None:
        return None
    now = timezone.now()
    usage = node.latest_usage()
    shard_usage = usage.shards if usage else {}
    shards = []
    for shard in (
        Shard.objects.filter(node_id=node_id, replica__state__in=ReplicaState.LIVE)
        .select_related("replica")
        .order_by("replica__model_name", "rank")
    ):
        used = shard_usage.get(shard.id)
        shards.append(
            {
                "shard": shard,
                "replica": shard.replica,
                "cpu_cores": used.cpu_cores if used else None,
                "rss": used.rss if used else None,
                "progress": progress_line(shard.progress),
            }
        )
    row = node_row(node, now, engine_origins())
    refusals = node_refusals(node_id)
    return {"row": row, "node": node, "shards": shards, "refusals": refusals, "now": now}


def node_refusals(node_id: str) -> list[dict[str, Any]]:
    """The replicas waiting for a node that this one refused, with what it said (each
    refusal keeps a few nodes' sentences a shortfall: at scale, most name none)."""
    prefix = f"{node_id}: "
    refusals = []
    for replica in Replica.objects.filter(state=ReplicaState.UNPLACEABLE):
        lines = [line[len(prefix) :] for line in replica.reasons if line.startswith(prefix)]
        if lines:
            refusals.append({"replica": replica, "lines": lines})
    return refusals


def model_detail(name: str) -> dict[str, Any] | None:
    """One model's profiles, its live replicas and what happened to them lately."""
    model = Model.objects.filter(name=name).prefetch_related("profiles").first()
    replicas = [r for r in live_replicas() if r.model_name == name]
    if model is None and not replicas:
        return None
    profiles = list(model.profiles.all()) if model else []
    newest = newest_engine_versions()
    fingerprints = {p.name: p.fingerprint(newest) for p in profiles}
    backoffs = backoff_lines(replicas)
    items = [
        replica_item(r, backoffs, stale=not r.runs_settings(fingerprints.get(r.profile_name, "")))
        for r in replicas
    ]
    ready_by_profile: dict[str, int] = {}
    for replica in replicas:
        if replica.state == ReplicaState.READY:
            ready_by_profile[replica.profile_name] = (
                ready_by_profile.get(replica.profile_name, 0) + 1
            )
    subjects = [str(r.id) for r in replicas] + [f"{name}/{p.name}" for p in profiles] + [name]
    scalings = last_scalings()
    return {
        "name": name,
        "model": model,
        "profiles": [
            {
                "profile": p,
                "ready": ready_by_profile.get(p.name, 0),
                "fingerprint": fingerprints[p.name],
                "engine_version": p.resolved_engine_version(newest),
                "last_scaling": scalings.get(f"{name}/{p.name}", ""),
            }
            for p in profiles
        ],
        "replicas": items,
        "wanted": sum(p.replicas for p in profiles),
        "ready": sum(ready_by_profile.values()),
        "events": list(Event.objects.filter(subject__in=subjects)[:20]),
    }


def last_scalings() -> dict[str, str]:
    """The autoscaler's latest decision per profile ("gemma/cpu"), with its reason."""
    from catalog.models import Profile

    autoscaled = [str(p) for p in Profile.objects.exclude(autoscale=None).select_related("model")]
    latest: dict[str, str] = {}
    events = Event.objects.filter(subject__in=autoscaled, reason__startswith="scaled ")
    for subject, reason in events.order_by("-id").values_list("subject", "reason"):
        latest.setdefault(subject, reason)
    return latest


def adapter_rows(model: str | None = None) -> list[dict[str, Any]]:
    """Each LoRA adapter (of ``model``, or of every model): its id, base, scale, the ready
    replicas that loaded it at start and those that load it when asked (vLLM with
    max_loras), and its requests in the last hour."""
    ready = Replica.objects.filter(state=ReplicaState.READY, draining_since__isnull=True)
    ready = ready.select_related("profile__model").order_by("created_at")
    models = Model.objects.prefetch_related("profiles")
    rows = []
    for row in models.filter(name=model) if model else models:
        for adapter in row.adapters:
            serving = [r for r in ready if r.model_name == row.name and r.profile is not None
                       and adapter in row.adapters_for(r.profile)]  # fmt: skip
            loaded = [str(r.id) for r in serving if adapter["name"] in (r.adapters or [])]
            name = adapter_id(row.name, adapter["name"])
            rows.append({
                "adapter": name, "model": row.name, "scale": adapter.get("scale", 1.0),
                "source": adapter["source"], "loaded": loaded,
                "on_demand": [str(r.id) for r in serving if str(r.id) not in loaded
                              and r.profile is not None and r.profile.max_loras > 0
                              and loras_of(r.engine).at_runtime],
                "requests_last_hour": sum(c.get("requests", 0) for _t, c in buckets(name)),
            })  # fmt: skip
    return rows
