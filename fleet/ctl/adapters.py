"""``llmgw_ctl adapters``: each model's LoRA adapters, the ready replicas that serve each
(loaded at start, or able to load it on demand), and its requests in the last hour; and
``adapters load|unload ADAPTER REPLICA`` by hand, where the engine does that while it runs."""

from __future__ import annotations

from django.core.management.base import CommandError

from audit.actors import shell_operator
from core.tables import render_json, render_table
from fleet.actions.adapters import AdapterRefused, load_adapter, unload_adapter
from fleet.selectors import adapter_rows


def add_parsers(subparsers) -> None:
    adapters = subparsers.add_parser(
        "adapters", help="list LoRA adapters, the replicas serving each, and their traffic"
    )
    adapters.add_argument("--json", action="store_true")
    adapters.set_defaults(handler=adapters_command)
    actions = adapters.add_subparsers(dest="adapter_action", metavar="ACTION")
    for action, verb, text in (
        ("load", load_adapter, "load an adapter on a ready vLLM replica now"),
        ("unload", unload_adapter, "unload an adapter from a ready vLLM replica"),
    ):
        parser = actions.add_parser(action, help=text)
        parser.add_argument("adapter", help="<model>:<adapter>")
        parser.add_argument("replica", help="the replica's id, or its first 8 characters")
        parser.set_defaults(handler=adapter_action_command, verb=verb)


def adapter_action_command(options, out) -> None:
    try:
        said = options["verb"](options["adapter"], options["replica"], actor=shell_operator())
    except AdapterRefused as refused:
        raise CommandError(str(refused)) from None
    out.write(f"{options['adapter']}: the engine answered {said}\n")


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
