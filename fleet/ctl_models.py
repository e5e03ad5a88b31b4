"""``llmgw_ctl models``: each model with its wanted, ready and starting replicas."""

from __future__ import annotations

from core.tables import render_json, render_table
from fleet.models import ReplicaState
from fleet.selectors import model_rows


def add_parsers(subparsers) -> None:
    models = subparsers.add_parser("models", help="list models with wanted and ready replicas")
    models.add_argument("--json", action="store_true")
    models.set_defaults(handler=models_command)


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
