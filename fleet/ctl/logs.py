"""``llmgw_ctl logs NODE [--source SHARD] [-n N]``: a node's recent log lines, from its agent."""

from __future__ import annotations

from django.core.management.base import CommandError

from fleet import commands
from fleet.ctl.common import known_node
from protocol.commands import LOG_LINES_KEPT


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
    if not 1 <= lines <= LOG_LINES_KEPT:
        raise CommandError(f"-n {lines}: ask for 1 to {LOG_LINES_KEPT} lines")
    known_node(node_id)
    try:
        answer = commands.read_logs(node_id, source, lines)
    except commands.AgentDidNotAnswer as exc:
        raise CommandError(str(exc)) from None
    found = answer.get("lines", [])
    if not found:
        sources = ", ".join(answer.get("sources", [])) or "none"
        raise CommandError(f"{node_id} has no lines from {source!r}; its sources: {sources}")
    out.write("\n".join(found))
