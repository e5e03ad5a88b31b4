"""``manage.py llmgw_up``: the same as ``llmgw up``."""

from django.core.management.base import BaseCommand

from llmgw_cli.up import run


class Command(BaseCommand):
    help = "Start the control plane, router, reconciler and a local agent; Ctrl-C stops all."
    requires_system_checks = []

    def handle(self, *args, **options) -> None:
        run([])
