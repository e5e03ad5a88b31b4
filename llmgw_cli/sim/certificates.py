"""The sim's TLS, made on cp1 before anything starts (``python -m llmgw_cli.sim.certificates``):
llmgw's CA (``llmgw_ctl ca init``), the control planes' serving certificate (names and
addresses: agents link by wss://cp1:8000, benches by address) and Redis' on the services
host. The operator's later run keeps the CA: every node's certificate comes from it.
"""

from __future__ import annotations

import argparse
import io
import os
import sys


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m llmgw_cli.sim.certificates")
    parser.add_argument("--control", required=True, help="OUT=HOST,HOST…: the control planes'")
    parser.add_argument("--services", required=True, help="OUT=HOST,HOST…: Redis'")
    options = parser.parse_args(argv)

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llmgw_site.settings")
    import django
    from django.core.management import call_command

    django.setup()  # files only: nothing here reads the database, which is not up yet
    call_command("llmgw_ctl", "ca", "init", stdout=io.StringIO())
    for spec in (options.control, options.services):
        out, _, names = spec.partition("=")
        call_command("llmgw_ctl", "ca", "server-cert", *names.split(","), "--out", out,
                     stdout=io.StringIO())  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
