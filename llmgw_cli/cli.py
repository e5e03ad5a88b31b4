"""The ``llmgw`` command: ``llmgw up`` starts everything, ``llmgw supervise`` keeps one
process running, ``llmgw sim`` runs a fleet in network namespaces; anything else goes to
manage.py."""

from __future__ import annotations

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llmgw_site.settings")
    args = sys.argv[1:]
    if args[:1] == ["up"]:
        from llmgw_cli.up import run

        sys.exit(run(args[1:]))
    if args[:1] == ["sim"]:  # before the embedded services: the sim starts its own
        from llmgw_cli.sim.command import main as sim_main

        sys.exit(sim_main(args[1:]))
    if args[:1] == ["supervise"]:
        from llmgw_cli.supervise import supervise_main

        sys.exit(supervise_main(args[1:]))
    from django.core.management import execute_from_command_line

    from llmgw_cli.embedded import configure_services

    configure_services()
    execute_from_command_line(["llmgw", *args])


if __name__ == "__main__":
    main()
