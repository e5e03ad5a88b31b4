"""``llmgw_ctl`` subcommands for the catalog: apply, export, delete, models."""

from __future__ import annotations

import sys
from pathlib import Path

import yaml
from django.core.management.base import CommandError

from audit.actors import shell_operator
from catalog.actions.entries import apply_catalog, delete_entry
from catalog.models import Fabric, Model, Pool
from catalog.plan import across_nodes_lines, export_catalog, fit_lines, resolver_after
from catalog.schema import CatalogError, parse_catalog
from core.humanize import no_such


def add_parsers(subparsers) -> None:
    apply = subparsers.add_parser("apply", help="create or update what a catalog file names")
    apply.add_argument("-f", "--file", required=True, help="catalog YAML file, or - for stdin")
    apply.add_argument("--dry-run", action="store_true", help="print the changes, apply nothing")
    apply.add_argument("--prune", action="store_true", help="also remove what the file omits")
    apply.set_defaults(handler=apply_command)

    export = subparsers.add_parser("export", help="write the catalog in apply's format")
    export.add_argument("-o", "--output", help="file to write (default: stdout)")
    export.set_defaults(handler=export_command)

    delete = subparsers.add_parser("delete", help="delete a model, pool or fabric")
    delete.add_argument("kind", choices=["model", "pool", "fabric"])
    delete.add_argument("name")
    delete.set_defaults(handler=delete_command)


def apply_command(options, out) -> None:
    path = options["file"]
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
    except OSError as exc:
        raise CommandError(f"cannot read {path}: {exc.strerror}") from None
    try:
        changes = apply_catalog(
            text,
            filename=path,
            dry_run=options["dry_run"],
            prune=options["prune"],
            actor=shell_operator(),
        )
    except CatalogError as exc:
        raise CommandError(
            "nothing applied; fix these and run again:\n  " + "\n  ".join(exc.problems)
        ) from None
    for change in changes:
        out.write(change.describe())
    verb = "would change" if options["dry_run"] else "changed"
    out.write(f"{verb} {len(changes)} entr{'y' if len(changes) == 1 else 'ies'}")
    catalog = parse_catalog(text, path)
    lines = fit_lines(catalog)
    if lines:
        out.write("memory each rank needs, from the model files:")
        for line in lines:
            out.write(line)
    for line in across_nodes_lines(catalog):
        out.write(line)
    # Wired by llmgw_ctl (the fleet's replicas are above the catalog): the running replicas
    # an engine version change restarts, counted as the file will resolve each profile.
    restarts = options.get("engine_restarts")
    if restarts is not None:
        resolve = resolver_after(catalog, prune=options["prune"])
        for line in restarts(resolve, planned=options["dry_run"]):
            out.write(line)


def export_command(options, out) -> None:
    text = yaml.safe_dump(export_catalog(), sort_keys=False, allow_unicode=True)
    if options.get("output"):
        Path(options["output"]).write_text(text)
    else:
        out.write(text.rstrip("\n"))


def delete_command(options, out) -> None:
    try:
        existed = delete_entry(options["kind"], options["name"], actor=shell_operator())
    except CatalogError as exc:
        raise CommandError(exc.problems[0]) from None
    if not existed:
        raise CommandError(no_such(options["kind"], options["name"], _names_of(options["kind"])))
    out.write(f"deleted {options['kind']} {options['name']}")


def _names_of(kind: str) -> list[str]:
    """Every name of one kind the catalog has, to say what could have been meant."""
    rows = {"model": Model.objects, "pool": Pool.objects, "fabric": Fabric.objects}[kind]
    return list(rows.order_by("name").values_list("name", flat=True))
