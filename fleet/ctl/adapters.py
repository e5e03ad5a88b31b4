"""``llmgw_ctl adapters``: each model's LoRA adapters, the ready replicas that serve each
(loaded at start, or able to load it on demand), and its requests in the last hour."""

from __future__ import annotations

from core.tables import render_json, render_table
from fleet.selectors import adapter_rows


def add_parsers(subparsers) -> None:
    adapters = subparsers.add_parser(
        "adapters", help="list LoRA adapters, the replicas serving each, and their traffic"
    )
    adapters.add_argument("--json", action="store_true")
    adapters.set_defaults(handler=adapters_command)


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
