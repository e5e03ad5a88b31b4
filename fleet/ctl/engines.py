"""``llmgw_ctl engines``: every engine version nodes are told to have or report having,
where it came from (llmgw's default, the catalog's ``engines:``, or found on the node by
its agent file), what it is built from, and how it stands on the nodes; ``pin-engines``:
pin profiles to the versions their replicas run."""

from __future__ import annotations

from collections import Counter
from typing import Any

from audit.actors import shell_operator
from catalog.actions.profiles import pin_engine_versions
from catalog.models import engine_origins
from core.collector import collecting_less
from core.tables import render_json, render_table
from fleet.ctl.common import known_model
from fleet.models import Node
from fleet.planning.engine_restarts import running_engine_versions
from fleet.reconcile.engines import wanted_engines
from fleet.selectors import engine_origin
from protocol.engines import PIP_ENGINES, WantedEngine, natural_key


def add_parsers(subparsers) -> None:
    engines = subparsers.add_parser(
        "engines", help="engine versions: where each came from, and how it stands on the nodes"
    )
    engines.add_argument("--json", action="store_true")
    engines.set_defaults(handler=engines_command)

    pin = subparsers.add_parser(
        "pin-engines",
        help="pin unpinned profiles to the engine version their replicas run, so that a new "
        "version in the catalog or an upgrade of llmgw's default build restarts none",
    )
    pin.add_argument("models", nargs="*", metavar="MODEL", help="these models only (default: all)")
    pin.set_defaults(handler=pin_engines_command)


def pin_engines_command(options, out) -> None:
    models = [known_model(name) for name in options["models"]] or None
    pinned = pin_engine_versions(running_engine_versions(models), actor=shell_operator())
    for line in pinned:
        out.write(f"pinned {line}")
    if not pinned:
        out.write("nothing to pin: every profile with running replicas is pinned already")


def built_from(wanted: WantedEngine | None) -> str:
    """What a node installs for this version, in one line; "" for one llmgw never installs."""
    if wanted is None:
        return ""
    if wanted.name in PIP_ENGINES:
        return f"pip {wanted.name}=={wanted.version}"
    return ", ".join(
        f"{build.platform}/{build.accelerator}: "
        + (f"pip {build.pip} (sha256 {build.sha256[:12]}…)" if build.pip else build.url)
        for build in wanted.builds
    )


def engine_rows() -> list[dict[str, Any]]:
    """One row per engine version, wanted ones first, each with its nodes' statuses."""
    origins = engine_origins()
    wanted = {engine.key: engine for engine in wanted_engines()}
    rows: dict[tuple[str, str], dict[str, Any]] = {
        key: {"engine": key[0], "version": key[1], "origin": origins.get(key, ""),
              "built_from": built_from(engine), "nodes": {}}
        for key, engine in wanted.items()
    }  # fmt: skip
    with collecting_less():
        for node in Node.objects.only("id", "engines").order_by("id"):
            for install in node.engine_installs() or []:
                key = (install.engine, install.version)
                row = rows.setdefault(key, {
                    "engine": key[0], "version": key[1], "built_from": "", "nodes": {},
                    "origin": engine_origin(install, origins),
                })  # fmt: skip
                row["nodes"][node.id] = install.words
    found = sorted(set(rows) - set(wanted), key=lambda k: (k[0], natural_key(k[1])))
    return [rows[key] for key in [*wanted, *found]]


def nodes_cell(statuses: dict[str, str]) -> str:
    """``2 installed, 1 installing``: how many nodes stand each way."""
    if not statuses:
        return "no node yet"
    counted = Counter(words.split(":")[0] for words in statuses.values())
    return ", ".join(f"{count} {status}" for status, count in sorted(counted.items()))


def engines_command(options, out) -> None:
    rows = engine_rows()
    if options["json"]:
        out.write(render_json(rows, pretty=out.isatty()))
        return
    headers = ["ENGINE", "VERSION", "FROM", "NODES", "BUILT FROM"]
    table = [[row["engine"], row["version"], row["origin"], nodes_cell(row["nodes"]),
              row["built_from"]] for row in rows]  # fmt: skip
    out.write(render_table(headers, table) if table else "no engine is named or found")
