"""What an operator does once on a control-plane host before the nodes start, run there by
``llmgw sim up`` (``python -m llmgw_cli.sim.operator``): migrate, ``llmgw_ctl router-role``,
``llmgw_ctl ca init``,
``llmgw_ctl onboard NODE`` for every node, apply the catalog, create an API key.

The same ``llmgw_ctl`` commands a person would type, in one process: each Django start
costs seconds on a small machine, and this runs on every ``sim up``.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m llmgw_cli.sim.operator")
    parser.add_argument("--nodes", required=True, help="node ids, comma separated")
    parser.add_argument("--servers", required=True)
    # The agents' broker: this host's REDIS_URL unless named (not on a command line: its password).
    parser.add_argument("--broker", default=os.environ.get("REDIS_URL", ""))
    parser.add_argument("--bundles", required=True, help="directory for one bundle per node")
    parser.add_argument("--insecure", action="store_true",
                        help="the link and Redis are plaintext on the sim's bridge")  # fmt: skip
    parser.add_argument("--catalog", default="", help="a catalog file to apply")
    parser.add_argument("--key-file", required=True, help="where the API key is written")
    parser.add_argument("--router-password-file", required=True,
                        help="the router's database role's password")  # fmt: skip
    options = parser.parse_args(argv)

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llmgw_site.settings")
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", interactive=False, verbosity=0)
    # The router reads as a role of its own, made once the tables it is granted exist.
    call_command("llmgw_ctl", "router-role", "--password-file", options.router_password_file,
                 stdout=io.StringIO())  # fmt: skip
    from django.conf import settings

    # Kept when llmgw_cli.sim.certificates made it (with the serving certificates, for TLS).
    if not (Path(settings.LLMGW_CA_DIR) / "ca.pem").exists():
        call_command("llmgw_ctl", "ca", "init")
    for node in options.nodes.split(","):
        call_command("llmgw_ctl", "onboard", node, "--servers", options.servers, "--broker",
                     options.broker, "--certificate-only", "--out",
                     str(Path(options.bundles) / node),
                     *(["--insecure"] if options.insecure else []))  # fmt: skip
    if options.catalog:
        call_command("llmgw_ctl", "apply", "-f", options.catalog)
    created = io.StringIO()
    call_command("llmgw_ctl", "keys", "create", "llmgw-sim", stdout=created)
    from core.secret_files import write_secret_file

    write_secret_file(Path(options.key_file), created.getvalue().splitlines()[0] + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
