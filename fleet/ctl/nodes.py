"""``llmgw_ctl nodes``, ``drain``, ``pool``, ``engine-check`` and ``node-token``: the nodes,
each with its state, use and warnings, and what an operator does to one."""

from __future__ import annotations

from django.core.management.base import CommandError

from audit.actors import shell_operator
from catalog.models import engine_origins
from core.collector import collecting_less
from core.humanize import format_bytes
from core.tables import render_json, render_table
from fleet import commands
from fleet.actions.nodes import NodeRefused, drain_node, set_node_pool, undrain_node
from fleet.ctl.common import ago, known_node
from fleet.models import Node, Replica, ReplicaState
from fleet.pki.tokens import node_token
from fleet.selectors import engine_row


def add_parsers(subparsers) -> None:
    nodes = subparsers.add_parser("nodes", help="list nodes with state, use and warnings")
    nodes.add_argument("--json", action="store_true")
    nodes.set_defaults(handler=nodes_command)

    drain = subparsers.add_parser("drain", help="place nothing more on a node; move replicas off")
    drain.add_argument("node")
    drain.add_argument("--undo", action="store_true", help="return the node to service")
    drain.set_defaults(handler=drain_command)

    pool = subparsers.add_parser("pool", help="put a node in one of the catalog's pools")
    pool.add_argument("node")
    pool.add_argument("pool", nargs="?", default="", help="a pool the catalog declares")
    pool.add_argument("--none", action="store_true", help="take the node out of every pool")
    pool.set_defaults(handler=pool_command)

    check = subparsers.add_parser("engine-check", help="run ENGINE --version on a node")
    check.add_argument("node")
    check.add_argument("engine")
    check.set_defaults(handler=engine_check_command)

    token = subparsers.add_parser("node-token", help="print the link token for a node's agent")
    token.add_argument("node", help="the node's hostname")
    token.set_defaults(handler=node_token_command)


def drain_command(options, out) -> None:
    node_id = known_node(options["node"])
    if options["undo"]:
        changed = undrain_node(node_id, actor=shell_operator())
        out.write(f"{node_id} returned to service" if changed else f"{node_id} was not draining")
        return
    changed = drain_node(node_id, actor=shell_operator())
    if not changed:
        out.write(f"{node_id} is already draining")
        return
    counted = Replica.objects.filter(shards__node_id=node_id, state__in=ReplicaState.COUNTED)
    on_node = counted.distinct().count()
    out.write(f"{node_id} is draining: {on_node} replica(s) will be moved off it")


def pool_command(options, out) -> None:
    node_id, pool = options["node"], options["pool"]
    if bool(pool) == options["none"]:
        raise CommandError("say which pool: llmgw_ctl pool NODE POOL, or NODE --none for none")
    try:
        changed = set_node_pool(node_id, pool, actor=shell_operator())
    except NodeRefused as exc:
        raise CommandError(str(exc)) from None
    where = f"pool {pool}" if pool else "no pool"
    out.write(f"{node_id} is in {where}" if changed else f"{node_id} was already in {where}")


def engine_check_command(options, out) -> None:
    try:
        answer = commands.engine_check(options["node"], options["engine"])
    except commands.AgentDidNotAnswer as exc:
        raise CommandError(str(exc)) from None
    out.write(answer["output"])
    if not answer["ok"]:
        raise CommandError(f"{options['engine']} on {options['node']} did not run cleanly")


def node_token_command(options, out) -> None:
    out.write(node_token(options["node"]))


def _node_row(node: Node, origins: dict[tuple[str, str], str]) -> dict:
    facts, usage = node.inventory_facts(), node.latest_usage()
    installs = node.engine_installs()
    return {
        "id": node.id,
        "state": node.state + (" (draining)" if node.draining else ""),
        "address": node.address,
        "cpu": f"{usage.cpu_percent:.0f}%" if usage else "",
        "ram": (
            f"{format_bytes(usage.memory_used)}/{format_bytes(usage.memory_total)}" if usage else ""
        ),
        "gpus": len(facts.gpus) if facts else 0,
        "engines": None if installs is None else [engine_row(i, origins) for i in installs],
        "warnings": "; ".join(node.warnings),
        "last_heartbeat": ago(node.last_heartbeat),
    }


def nodes_command(options, out) -> None:
    with collecting_less():  # every node's reports, decoded and read back
        origins = engine_origins()
        rows = [_node_row(node, origins) for node in Node.objects.defer("weights")]
    if options["json"]:
        # Indented for a terminal; a pipe (jq, a script) gets it on one line, at a fleet's
        # size several times faster.
        out.write(render_json(rows, pretty=out.isatty()))
        return
    headers = ["NODE", "STATE", "ADDRESS", "CPU", "RAM", "GPUS", "ENGINES", "HEARD", "WARNINGS"]
    keys = ["id", "state", "address", "cpu", "ram", "gpus", "engines", "last_heartbeat",
            "warnings"]  # fmt: skip
    table = [dict(row, engines=_engines_cell(row["engines"])) for row in rows]
    out.write(render_table(headers, [[row[k] for k in keys] for row in table]))


def _engines_cell(engines: list[dict] | None) -> str:
    if engines is None:
        return "(not reported)"
    if not engines:
        return "none"
    return "; ".join(f"{e['engine']} {e['version']} {e['words']}".strip() for e in engines)
