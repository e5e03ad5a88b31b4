"""``llmgw_ctl weights``: what each node holds, where each model is (``--by-fabric``),
fetching a model ahead of need, and deleting fetched weights nothing uses."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError

from catalog.models import Model
from core.humanize import format_bytes
from core.tables import render_json, render_table
from fleet import commands
from fleet.ctl.common import known_model, known_node
from fleet.models import Node
from fleet.selectors import progress_line
from fleet.weights_map import model_weights, weights_map


def add_parsers(subparsers) -> None:
    weights = subparsers.add_parser(
        "weights", help="weights per node or per model; fetch MODEL ahead of need; collect"
    )
    weights.add_argument(
        "target", nargs="*", metavar="NODE | fetch MODEL",
        help="only this node; or `fetch MODEL` with --node or --fabric",
    )  # fmt: skip
    weights.add_argument(
        "--by-fabric",
        action="store_true",
        help="per model: the fabrics and nodes that hold it, and fetches",
    )
    weights.add_argument("--node", dest="fetch_node", help="with fetch: this node")
    weights.add_argument("--fabric", dest="fetch_fabric", help="with fetch: every node on it")
    weights.add_argument(
        "--collect", action="store_true",
        help="delete weights llmgw fetched onto NODE that no catalog model uses",
    )  # fmt: skip
    weights.add_argument("--json", action="store_true")
    weights.set_defaults(handler=weights_command)


def weights_command(options, out) -> None:
    target = options["target"]
    if target[:1] == ["fetch"]:
        fetch_command(target[1:], options, out)
        return
    if len(target) > 1:
        raise CommandError("llmgw_ctl weights takes one NODE, or fetch MODEL --node N|--fabric F")
    options["node"] = target[0] if target else None
    if options["by_fabric"]:
        by_fabric_command(options, out)
        return
    nodes = Node.objects.all()
    if options["node"]:
        nodes = nodes.filter(id=known_node(options["node"]))
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
        {"node": node.id, **weight.model_dump(mode="json")}
        for node in nodes
        for weight in node.weight_files()
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


def by_fabric_command(options, out) -> None:
    mapped = weights_map()
    rows: list[dict[str, Any]] = [
        {
            "model": row.model,
            "fabrics": row.fabrics,
            "nodes": row.nodes,
            "shared_stores": row.stores,
            "bytes": row.size,
            "fetching": {node: progress_line(p) or "starting" for node, p in row.fetching.items()},
        }
        for row in model_weights(mapped)
    ]
    if options["json"]:
        out.write(render_json({"models": rows, "total_bytes": mapped.total}))
        return
    table = [
        [row["model"], ",".join(row["fabrics"]) or "-", ",".join(row["nodes"]) or "none",
         format_bytes(row["bytes"]),
         "; ".join(f"{node}: {text}" for node, text in row["fetching"].items()) or "-"]
        for row in rows
    ]  # fmt: skip
    out.write(render_table(["MODEL", "FABRICS", "HELD BY", "BYTES", "FETCHING"], table))
    out.write(f"total held: {format_bytes(mapped.total)} (a shared store counted once)")


def fetch_command(args: list[str], options, out) -> None:
    if len(args) != 1:
        raise CommandError("say which model: llmgw_ctl weights fetch MODEL --node N|--fabric F")
    model = Model.objects.get(name=known_model(args[0]))
    nodes = fetch_targets(options["fetch_node"], options["fetch_fabric"])
    for node_id in nodes:
        try:
            answer = commands.fetch_weights(node_id, model.source, model.sha256)
        except commands.AgentDidNotAnswer as exc:
            raise CommandError(str(exc)) from None
        if answer["fetching"]:
            out.write(f"{node_id}: fetching {model.source}")
        else:
            out.write(f"{node_id}: not fetching: {answer['reason']}")


def fetch_targets(node_id: str | None, fabric: str | None) -> list[str]:
    if bool(node_id) == bool(fabric):
        raise CommandError("say where: --node NODE or --fabric FABRIC (one of them)")
    if node_id:
        return [known_node(node_id)]
    on_fabric = [node for node, names in weights_map().fabrics.items() if fabric in names]
    if not on_fabric:
        raise CommandError(f"no node reports fabric {fabric!r}")
    return sorted(on_fabric)
