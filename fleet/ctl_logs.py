"""``llmgw_ctl logs NODE [--source SHARD] [-n N]``: a node's recent log lines, from its agent."""

from __future__ import annotations

from django.core.management.base import CommandError

from fleet import commands
from fleet.models import Node

MAX_LINES = 2000  # what an agent keeps per source


def add_parsers(subparsers) -> None:
    logs = subparsers.add_parser(
        "logs", help="print a node's recent log lines: its agent's, or one engine's"
    )
    logs.add_argument("node", help="the node's id (its hostname)")
    logs.add_argument(
        "--source", default="agent", help="agent (the default) or a shard id running there"
    )
    logs.add_argument("-n", type=int, default=200, dest="lines", help="how many lines (200)")
    logs.set_defaults(handler=logs_command)


def logs_command(options, out) -> None:
    node_id, source, lines = options["node"], options["source"], options["lines"]
    if not 1 <= lines <= MAX_LINES:
        raise CommandError(f"-n {lines}: ask for 1 to {MAX_LINES} lines")
    if not Node.objects.filter(id=node_id).exists():
        known = ", ".join(Node.objects.values_list("id", flat=True)[:20]) or "none yet"
        raise CommandError(f"no node named {node_id!r} (nodes: {known})")
    try:
        answer = commands.read_logs(node_id, source, lines)
    except commands.AgentDidNotAnswer as exc:
        raise CommandError(str(exc)) from None
    found = answer.get("lines", [])
    if not found:
        sources = ", ".join(answer.get("sources", [])) or "none"
        raise CommandError(f"{node_id} has no lines from {source!r}; its sources: {sources}")
    out.write("\n".join(found))
