"""``llmgw sim up --nodes N | down | status | cut|heal|unimpair HOST | impair HOST SPEC |
exec HOST -- CMD…``."""

from __future__ import annotations

import argparse
import os
import sys

from llmgw_cli.sim import network


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="llmgw sim", description=__doc__)
    verbs = top.add_subparsers(dest="verb", required=True, metavar="VERB")
    up = verbs.add_parser("up", help="build the fleet (refused while another one runs)")
    up.add_argument("--nodes", type=int, default=2, help="node hosts (default 2)")
    up.add_argument("--replace", action="store_true",
                    help="take down the simulated fleet running on this machine first")  # fmt: skip
    up.add_argument("--no-demo", action="store_true", help="apply no demo catalog")
    verbs.add_parser("down", help="stop every process, remove every namespace and link")
    verbs.add_parser("status", help="hosts, addresses, links and processes")
    for verb, text in (("cut", "take a host's link down: it reaches no other host"),
                       ("heal", "bring a host's link back up"),
                       ("unimpair", "take delay and loss off a host's link")):  # fmt: skip
        verbs.add_parser(verb, help=text).add_argument("host")
    impair = verbs.add_parser("impair", help="delay and loss on a host's link (netem, or a "
                              "relay where the kernel has none)")  # fmt: skip
    impair.add_argument("host")
    impair.add_argument("spec", help="e.g. 'delay 50ms loss 1%%'")
    run = verbs.add_parser("exec", help="run a command on a host: llmgw sim exec cp1 -- hostname")
    run.add_argument("host")
    run.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- CMD")
    return top


def main(argv: list[str]) -> int:
    options = parser().parse_args(argv)
    reason = network.unavailable_reason()
    if reason:
        print(f"llmgw sim: {reason}", file=sys.stderr)
        return 2
    from llmgw_cli.sim import fleet

    try:
        if options.verb == "up":
            started = fleet.up(options.nodes, demo=not options.no_demo, replace=options.replace)
            print(f"the simulated fleet is up; its state is in {started.directory}")
            print("\n".join(fleet.status(started.directory)))
        elif options.verb == "down":
            fleet.down()
        elif options.verb == "status":
            print("\n".join(fleet.status()))
        elif options.verb in ("cut", "heal", "impair", "unimpair"):
            on_link(options)
        else:
            return exec_on_host(options.host, options.argv)
    except (network.SimError, ValueError) as exc:
        print(f"llmgw sim {options.verb}: {exc}", file=sys.stderr)
        if options.verb == "up" and isinstance(exc, network.SimError) and not refused(exc):
            print("logs are under the state directory; `llmgw sim down` removes it all",
                  file=sys.stderr)  # fmt: skip
        return 1
    return 0


def refused(exc: Exception) -> bool:
    from llmgw_cli.sim.fleet import FleetRunning

    return isinstance(exc, FleetRunning)


def on_link(options: argparse.Namespace) -> None:
    """cut, heal, impair or unimpair one host's link, by its name in the running sim."""
    from llmgw_cli.sim import impair
    from llmgw_cli.sim.state import Fleet, state_dir

    state = Fleet.load(state_dir())
    if state is None or not network.our_namespaces():
        raise network.SimError("no simulated fleet here: llmgw sim up --nodes N starts one")
    host = state.host(options.host).name  # an unknown name is refused, naming the hosts
    if options.verb == "cut":
        network.cut(host)
    elif options.verb == "heal":
        network.heal(host)
    elif options.verb == "impair":
        impair.impair(host, options.spec)
    else:
        impair.unimpair(host)
    print(f"{options.verb}: {host}")


def exec_on_host(host: str, argv: list[str]) -> int:
    """Replace this process with ``argv`` on ``host``, in that host's environment."""
    from llmgw_cli.sim.state import REPO, Fleet, state_dir

    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        raise network.SimError("nothing to run: llmgw sim exec HOST -- COMMAND …")
    state = Fleet.load(state_dir())
    if state is None:
        raise network.SimError("no simulated fleet here: llmgw sim up --nodes N starts one")
    command = state.command(host, argv)
    os.chdir(REPO)
    os.execvpe(command[0], command, state.env.get(host, dict(os.environ)))  # noqa: S606 (argv, no shell)
    return 127  # not reached
