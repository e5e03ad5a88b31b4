"""``llmgw_ctl adapters``: each model's LoRA adapters, the ready replicas that serve each
(loaded at start, or able to load it on demand), and its requests in the last hour."""

from __future__ import annotations

from typing import Any

from catalog.models import Model
from core.tables import render_json, render_table
from fleet.models import Replica, ReplicaState
from fleet.traffic import buckets
from protocol.shard import adapter_id, loras_of


def add_parsers(subparsers) -> None:
    adapters = subparsers.add_parser(
        "adapters", help="list LoRA adapters, the replicas serving each, and their traffic"
    )
    adapters.add_argument("--json", action="store_true")
    adapters.set_defaults(handler=adapters_command)


def adapter_rows() -> list[dict[str, Any]]:
    """One row per adapter: its id, base, scale, the ready replicas that loaded it at start
    and those that load it when asked (vLLM), and its requests in the last hour."""
    ready = list(
        Replica.objects.filter(state=ReplicaState.READY, draining_since__isnull=True)
        .select_related("profile__model")
        .order_by("created_at")
    )
    rows = []
    for model in Model.objects.prefetch_related("profiles"):
        for adapter in model.adapters:
            serving = [
                replica for replica in ready
                if replica.profile is not None and replica.model_name == model.name
                and adapter in model.adapters_for(replica.profile)
            ]  # fmt: skip
            loaded = [r for r in serving if adapter["name"] in (r.adapters or [])]
            on_demand = [r for r in serving if r not in loaded and _loads_on_demand(r)]
            name = adapter_id(model.name, adapter["name"])
            rows.append(
                {
                    "adapter": name,
                    "model": model.name,
                    "scale": adapter.get("scale", 1.0),
                    "source": adapter["source"],
                    "loaded": [str(r.id) for r in loaded],
                    "on_demand": [str(r.id) for r in on_demand],
                    "requests_last_hour": sum(c.get("requests", 0) for _t, c in buckets(name)),
                }
            )
    return rows


def _loads_on_demand(replica: Replica) -> bool:
    """Say whether ``replica`` loads adapters while it runs (vLLM with max_loras)."""
    profile = replica.profile
    return profile is not None and loras_of(replica.engine).at_runtime and profile.max_loras > 0


def adapters_command(options, out) -> None:
    rows = adapter_rows()
    if options["json"]:
        out.write(render_json(rows))
        return
    table = [
        [row["adapter"], row["model"], f"{row['scale']:g}",
         ",".join(r[:8] for r in row["loaded"]) or "-",
         ",".join(r[:8] for r in row["on_demand"]) or "-", row["requests_last_hour"]]
        for row in rows
    ]  # fmt: skip
    headers = ["ADAPTER", "MODEL", "SCALE", "LOADED ON", "LOADS ON DEMAND", "REQUESTS 1H"]
    out.write(render_table(headers, table) if table else "no adapters in the catalog\n")
