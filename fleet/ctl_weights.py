"""``llmgw_ctl weights``: what each node holds, and deleting fetched weights nothing uses."""

from __future__ import annotations

from django.core.management.base import CommandError

from core.humanize import format_bytes
from core.tables import render_json, render_table
from fleet import commands
from fleet.models import Node


def add_parsers(subparsers) -> None:
    weights = subparsers.add_parser("weights", help="list weights per node, or collect unused")
    weights.add_argument("node", nargs="?", help="only this node")
    weights.add_argument(
        "--collect", action="store_true",
        help="delete weights llmgw fetched onto NODE that no catalog model uses",
    )  # fmt: skip
    weights.add_argument("--json", action="store_true")
    weights.set_defaults(handler=weights_command)


def weights_command(options, out) -> None:
    nodes = Node.objects.all()
    if options["node"]:
        nodes = nodes.filter(id=options["node"])
        if not nodes.exists():
            known = ", ".join(Node.objects.values_list("id", flat=True)) or "none"
            raise CommandError(f"no node {options['node']!r} (nodes: {known})")
    if options["collect"]:
        if not options["node"]:
            raise CommandError("say which node to collect on: llmgw_ctl weights NODE --collect")
        try:
            answer = commands.collect_weights(options["node"])
        except commands.AgentDidNotAnswer as exc:
            raise CommandError(str(exc)) from None
        for path in answer["deleted"]:
            out.write(f"deleted {path}")
        out.write(f"deleted {len(answer['deleted'])} file(s) on {options['node']}")
        return
    rows = [
        {"node": node.id, **weight}
        for node in nodes
        for weight in (node.weights or [])
    ]  # fmt: skip
    if options["json"]:
        out.write(render_json(rows))
        return
    table = [
        [row["node"], row.get("source", ""), format_bytes(row.get("size", 0)),
         "fetched" if row.get("fetched") else "the operator's", row.get("path", "")]
        for row in rows
    ]  # fmt: skip
    out.write(render_table(["NODE", "SOURCE", "SIZE", "WHOSE", "PATH"], table))
