"""One model's weights across the fleet, as the mirror page shows them: who holds them and
how many bytes, on which fabrics and shared stores, what is downloading, and a warning
when no node that could serve the model holds them or could fetch them."""

from __future__ import annotations

from typing import Any

from django.utils import timezone

from catalog.models import Model
from core.humanize import format_bytes
from fleet.models import Node, Shard, ShardState
from fleet.planning.snapshot import node_snapshots, placement_request
from fleet.selectors import progress_line
from fleet.weights_map import weights_map
from placement.filters import engine_installed, node_connected, ram_free


def mirror_detail(name: str) -> dict[str, Any] | None:
    model = Model.objects.filter(name=name).prefetch_related("profiles").first()
    if model is None:
        return None
    mapped = weights_map()
    holders = set(mapped.holders(model.source))
    nodes = {node.id: node for node in Node.objects.all()}
    rows: list[dict[str, Any]] = []
    for node_id in sorted(holders):
        own = [w for w in nodes[node_id].weight_files() if w.source == model.source]
        runs_from_path = not own and model.source in mapped.runs_from.get(node_id, ())
        rows.append(
            {
                "node": node_id,
                "fabrics": mapped.fabrics.get(node_id, []),
                "size": sum(w.size for w in own),
                "store": next((w.store for w in own if w.store), ""),
                # Holds it without listing it: an engine of it runs from its path there...
                "runs_from_path": runs_from_path,
                # ...or it lies on a shared store the node reports.
                "seen_on_share": not own and not runs_from_path,
            }
        )
    downloads = [
        {"node": node_id, "shard": shard_id, "progress": progress_line(progress) or "starting"}
        for shard_id, node_id, progress in Shard.objects.filter(
            replica__model_name=name, state=ShardState.FETCHING, node__isnull=False
        ).values_list("id", "node_id", "progress")
    ]
    return {
        "name": name,
        "model": model,
        "holders": rows,
        "fabrics": sorted({f for row in rows for f in row["fabrics"]}),
        "stores": sorted(mapped.stores_of.get(model.source, ())),
        "held_bytes": mapped.held_bytes.get(model.source, 0),
        "downloads": downloads,
        "warnings": no_holder_warnings(model, holders),
        "subjects": [name],
    }


def no_holder_warnings(model: Model, holders: set[str]) -> list[str]:
    """For each profile: a warning when no node that could serve it holds the weights, and
    none could fetch them (a path is never fetched; a URL or a hub id is)."""
    fetchable = not model.source.startswith("/")
    snapshots = node_snapshots(timezone.now())
    warnings = []
    for profile in model.profiles.all():
        request = placement_request(f"{model.name}/{profile.name}", profile)
        able = [
            node.id
            for node in snapshots
            if all(
                check(node, request) is None
                for check in (node_connected, engine_installed, ram_free)
            )  # fmt: skip
        ]
        if (able and fetchable) or holders.intersection(able):
            continue
        engine = f"{profile.engine} {profile.engine_version}".strip()
        needs = f"{engine} and {format_bytes(profile.memory)} free" if profile.memory else engine
        reach = "can reach its URL" if fetchable else "could fetch it (its source is a path)"
        warnings.append(f"no node with {needs} holds {model.name} or {reach}")
    return warnings
