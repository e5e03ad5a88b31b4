"""``llmgw_ctl models``, ``replicas``, ``status``, ``check-placement`` and ``rollout``: what
runs for each model, why any cannot (and how old that is), and its rolling restarts."""

from __future__ import annotations

from django.core.management.base import CommandError

from audit.actors import shell_operator
from catalog.actions.profiles import pause_rollout, resume_rollout
from core.tables import render_json, render_table
from fleet.actions.replicas import ReplicaRefused, check_placement_again
from fleet.ctl.common import ago, known_model
from fleet.models import ReplicaState, engine_label
from fleet.reconcile.rollout import rollout_status
from fleet.selectors import backoff_lines, last_scalings, live_replicas, model_rows, progress_line
from fleet.weights_map import ModelWeights, model_weights


def add_parsers(subparsers) -> None:
    models = subparsers.add_parser("models", help="list models with wanted and ready replicas")
    models.add_argument("--json", action="store_true")
    models.set_defaults(handler=models_command)

    replicas = subparsers.add_parser("replicas", help="list replicas and their shards")
    replicas.add_argument("--json", action="store_true")
    replicas.set_defaults(handler=replicas_command)

    status = subparsers.add_parser("status", help="models, replicas and why any cannot run")
    status.add_argument("--json", action="store_true")
    status.set_defaults(handler=status_command)

    check = subparsers.add_parser(
        "check-placement", help="work out again now why a model's replicas wait for a node"
    )
    check.add_argument("model")
    check.set_defaults(handler=check_placement_command)

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


def models_command(options, out) -> None:
    rows = model_rows()
    if options["json"]:
        out.write(
            render_json(
                [
                    {
                        "name": r["name"],
                        "aliases": r["aliases"],
                        "serves": r["serves"],
                        "wanted": r["wanted"],
                        "ready": r["ready"],
                        "replicas": [str(i["replica"].id) for i in r["replicas"]],
                        "profiles": [_profile_needs(profile) for profile in r["profiles"]],
                    }
                    for r in rows
                ]
            )
        )
        return
    table = []
    for row in rows:
        states = [item["replica"].state for item in row["replicas"]]
        starting = sum(1 for s in states if s in (ReplicaState.PLACING, ReplicaState.STARTING))
        table.append(
            [row["name"], ",".join(row["aliases"]), ",".join(row["serves"]), row["wanted"],
             row["ready"], starting]
        )  # fmt: skip
    header = ["MODEL", "ALIASES", "SERVES", "WANTED", "READY", "STARTING"]
    out.write(render_table(header, table))
    # What each profile needs, from its model's file: a line each, too long for a column.
    for row in rows:
        for profile in row["profiles"]:
            if profile.fit_line:
                out.write(f"{row['name']}/{profile.name}: {profile.fit_line}")


def _profile_needs(profile) -> dict:
    """A profile's sizes as placement asks for them, and the estimate behind them."""
    need = profile.needs()
    return {
        "name": profile.name,
        "memory": need.memory,
        "gpu_memory": need.gpu_memory,
        "estimate": profile.fit_line,
    }


def _replica_dicts() -> list[dict]:
    result = []
    replicas = list(live_replicas())
    backoffs = backoff_lines(replicas)
    for replica in replicas:
        result.append(
            {
                "id": str(replica.id),
                "model": replica.model_name,
                "profile": replica.profile_name,
                "state": replica.state,
                "age": ago(replica.created_at),
                "fingerprint": replica.fingerprint or "unknown",
                "engine": replica.engine,
                "engine_version": replica.engine_version,
                "reasons": replica.reasons,
                # When placement worked them out: "never" while it works them out again.
                "reasons_worked_out": ago(replica.reasons_at) if replica.reasons else "",
                "backoff": backoffs.get(replica.id, ""),
                "shards": [
                    {
                        "rank": shard.rank,
                        "node": shard.node_id or "",
                        "gpus": shard.gpus,
                        "state": shard.state,
                        "age": ago(shard.state_changed_at),
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


def check_placement_command(options, out) -> None:
    model = options["model"]
    try:
        waiting = check_placement_again(model, actor=shell_operator())
    except ReplicaRefused as exc:
        raise CommandError(str(exc)) from exc
    out.write(f"{model}: {waiting} replica(s) waiting for a node; the next reconcile pass "
              "works out again why")  # fmt: skip


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
        reasons = list(r["reasons"])
        if reasons and r["state"] == ReplicaState.UNPLACEABLE:
            worked_out = r["reasons_worked_out"]
            said = "being worked out again" if worked_out == "never" else f"worked out {worked_out}"
            reasons[0] = f"{reasons[0]} ({said})"
        rows.extend(["", "", "", "", "", "", "", reason] for reason in reasons)
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
                line += f", draining since {ago(replica['draining_since'])}, " + (
                    "in flight unknown" if carried is None else f"{carried} in flight"
                )
            out.write(line)
