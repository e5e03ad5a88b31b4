"""``manage.py llmgw_ctl SUBCOMMAND``: the operator's command line."""

from __future__ import annotations

from django.core.management.base import BaseCommand

from catalog import ctl as catalog_ctl
from catalog import ctl_keys
from fleet import ctl as fleet_ctl
from fleet import ctl_logs, ctl_models, ctl_pki, ctl_weights
from router import ctl_usage


class Command(BaseCommand):
    help = "Operate llmgw: apply the catalog, list nodes, replicas and status."

    def add_arguments(self, parser) -> None:
        subparsers = parser.add_subparsers(dest="subcommand", required=True, metavar="SUBCOMMAND")
        for module in (catalog_ctl, ctl_keys, ctl_models, fleet_ctl, ctl_logs, ctl_weights,
                       ctl_pki, ctl_usage):  # fmt: skip
            module.add_parsers(subparsers)

    def handle(self, *args, **options) -> None:
        options["handler"](options, self.stdout)
