"""``manage.py llmgw_ctl SUBCOMMAND``: the operator's command line."""

from __future__ import annotations

from django.core.management.base import BaseCommand

from catalog import ctl as catalog_ctl
from catalog import ctl_keys
from catalog.teams import ctl as ctl_teams
from catalog.tokens import ctl as ctl_tokens
from fleet.ctl import adapters, engines, events, logs, nodes, pki, replicas, weights
from fleet.planning.engine_restarts import restart_lines
from router import database_role
from router.usage import ctl as usage_ctl


class Command(BaseCommand):
    help = "Operate llmgw: apply the catalog, list nodes, replicas and status."

    def add_arguments(self, parser) -> None:
        subparsers = parser.add_subparsers(dest="subcommand", required=True, metavar="SUBCOMMAND")
        for module in (catalog_ctl, ctl_keys, ctl_teams, ctl_tokens, replicas, adapters, nodes,
                       engines, logs, weights, pki, usage_ctl, database_role, events):  # fmt: skip
            module.add_parsers(subparsers)
        # The catalog's apply says what the fleet's replicas would go through: wired here,
        # where both are in reach.
        subparsers.choices["apply"].set_defaults(engine_restarts=restart_lines)

    def handle(self, *args, **options) -> None:
        options["handler"](options, self.stdout)
