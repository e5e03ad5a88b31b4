"""``llmgw_ctl`` subcommands for the fleet: nodes, replicas, status."""

from __future__ import annotations

from django.core.management.base import CommandError
from django.utils import timezone

from audit.actors import shell_operator
from catalog.actions import pause_rollout, resume_rollout
from core.humanize import format_bytes, format_seconds
from core.tables import render_json, render_table
from fleet import commands
from fleet.actions.nodes import NodeRefused, drain_node, set_node_pool, undrain_node
from fleet.ctl_common import known_model, known_node
from fleet.models import Node, Replica, ReplicaState, engine_label
from fleet.node_auth import node_token
from fleet.rollout import rollout_status
from fleet.selectors import (
    backoff_line,
    engine_row,
    last_scalings,
    live_replicas,
    model_rows,
    progress_line,
)
from fleet.weights_map import ModelWeights, model_weights


def add_parsers(subparsers) -> None:
    nodes = subparsers.add_parser("nodes", help="list nodes with state, use and warnings")
    nodes.add_argument("--json", action="store_true")
    nodes.set_defaults(handler=nodes_command)

    replicas = subparsers.add_parser("replicas", help="list replicas and their shards")
    replicas.add_argument("--json", action="store_true")
    replicas.set_defaults(handler=replicas_command)

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

    status = subparsers.add_parser("status", help="models, replicas and why any cannot run")
    status.add_argument("--json", action="store_true")
    status.set_defaults(handler=status_command)

    rollout = subparsers.add_parser("rollout", help="rolling restarts of stale profiles")
    actions = rollout.add_subparsers(dest="rollout_action", required=True, metavar="ACTION")
    progress = actions.add_parser("status", help="how far each profile's rollout has come")
    progress.add_argument("model")
    progress.add_argument("--json", action="store_true")
    progress.set_defaults(handler=rollout_status_command)
    for action, verb, text in (
        ("pause", pause_rollout, "start no new replica and drain no old one until resumed"),
        ("resume", resume_rollout, "let a paused rollout go on"),
    ):
        parser = actions.add_parser(action, help=text)
        parser.add_argument("model")
        parser.set_defaults(handler=rollout_switch_command, verb=verb, action=action)


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


def _ago(moment) -> str:
    return "never" if moment is None else f"{format_seconds(_seconds_since(moment))} ago"


def _seconds_since(moment) -> float:
    return (timezone.now() - moment).total_seconds()


def _node_row(node: Node) -> dict:
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
        "engines": None if installs is None else [engine_row(install) for install in installs],
        "warnings": "; ".join(node.warnings),
        "last_heartbeat": _ago(node.last_heartbeat),
    }


def nodes_command(options, out) -> None:
    rows = [_node_row(node) for node in Node.objects.all()]
    if options["json"]:
        out.write(render_json(rows))
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


def _replica_dicts() -> list[dict]:
    result = []
    now = timezone.now()
    for replica in live_replicas():
        result.append(
            {
                "id": str(replica.id),
                "model": replica.model_name,
                "profile": replica.profile_name,
                "state": replica.state,
                "age": _ago(replica.created_at),
                "fingerprint": replica.fingerprint or "unknown",
                "engine": replica.engine,
                "engine_version": replica.engine_version,
                "reasons": replica.reasons,
                "backoff": backoff_line(replica, now),
                "shards": [
                    {
                        "rank": shard.rank,
                        "node": shard.node_id or "",
                        "gpus": shard.gpus,
                        "state": shard.state,
                        "age": _ago(shard.state_changed_at),
                        "progress": shard.progress,
                        "reason": shard.reason,
                    }
                    for shard in replica.shards.all()
                ],
            }
        )
    return result


def replicas_command(options, out) -> None:
    replicas = _replica_dicts()
    if options["json"]:
        out.write(render_json(replicas))
        return
    out.write(_replicas_text(replicas))


def _replicas_text(replicas: list[dict]) -> str:
    rows = []
    for r in replicas:
        engine = engine_label(r["engine"], r["engine_version"])
        rows.append([r["model"], r["profile"], r["id"][:8], r["state"], r["age"], "", "", engine])
        for shard in r["shards"]:
            gpus = ",".join(str(g) for g in shard["gpus"]) or "-"
            rows.append(["", "", f"  rank {shard['rank']}", shard["state"], shard["age"],
                         shard["node"], gpus, shard["reason"]])  # fmt: skip
            progress = progress_line(shard["progress"])
            if progress:
                rows.append(["", "", "", "", "", "", "", f"downloading: {progress}"])
        rows.extend(["", "", "", "", "", "", "", reason] for reason in r["reasons"])
        if r["backoff"]:
            rows.append(["", "", "", "", "", "", "", r["backoff"]])
    headers = ["MODEL", "PROFILE", "REPLICA", "STATE", "AGE", "NODE", "GPUS", "ENGINE / WHY"]
    return render_table(headers, rows)


def status_command(options, out) -> None:
    weights = {row.model: row for row in model_weights()}
    scalings = last_scalings()
    models = []
    for row in model_rows():
        where = weights.get(row["name"]) or ModelWeights(model=row["name"], source="")
        scaled = [f"{s}: {r}" for s, r in scalings.items() if s.startswith(row["name"] + "/")]
        models.append({"name": row["name"], "wanted": row["wanted"], "ready": row["ready"],
                       "held_by": where.nodes, "fabrics": where.fabrics,
                       "fetching": sorted(where.fetching), "scaling": scaled})  # fmt: skip
    replicas = _replica_dicts()
    if options["json"]:
        out.write(render_json({"models": models, "replicas": replicas}))
        return
    table = [
        [m["name"], m["wanted"], m["ready"], ",".join(m["held_by"]) or "none",
         ",".join(m["fabrics"]) or "-", ",".join(m["fetching"]) or "-"]
        for m in models
    ]  # fmt: skip
    out.write(render_table(["MODEL", "WANTED", "READY", "HELD BY", "FABRICS", "FETCHING"], table))
    for scaled in (line for m in models for line in m["scaling"]):
        out.write(f"autoscaled {scaled}")
    if replicas:
        out.write("")
        out.write(_replicas_text(replicas))


def rollout_switch_command(options, out) -> None:
    name = known_model(options["model"])
    changed = options["verb"](name, actor=shell_operator())
    done = "paused" if options["action"] == "pause" else "resumed"
    if changed:
        out.write(f"rollout of {name} {done}")
    else:
        out.write(f"rollout of {name} was {'already paused' if done == 'paused' else 'not paused'}")


def rollout_status_command(options, out) -> None:
    rows = rollout_status(known_model(options["model"]))
    if options["json"]:
        out.write(render_json(rows))
        return
    headers = ["PROFILE", "WANTED", "UP-TO-DATE", "STALE", "DRAINING", "PAUSED", "SURGE",
               "UNAVAILABLE", "DRAIN"]  # fmt: skip
    table = [
        [r["profile"], r["wanted"], r["up_to_date_ready"], r["stale"], r["draining"],
         "yes" if r["paused"] else "no", r["surge"], r["unavailable"], f"{r['drain_timeout']}s"]
        for r in rows
    ]  # fmt: skip
    out.write(render_table(headers, table))
    for row in rows:
        if row["waiting"]:
            out.write(f"{row['profile']}: {row['waiting']}")
        for replica in row["replicas"]:
            line = f"  {row['profile']} {replica['id'][:8]} {replica['state']}"
            line += " up to date" if replica["up_to_date"] else " stale"
            if replica["draining_since"] is not None:
                carried = replica.get("in_flight")
                line += f", draining since {_ago(replica['draining_since'])}, " + (
                    "in flight unknown" if carried is None else f"{carried} in flight"
                )
            out.write(line)
