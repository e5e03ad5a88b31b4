"""``llmgw_ctl teams``: make teams, set their budgets and cap per key, give people roles
in them, open models to them; list them and show what their keys spent of each budget."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import redis
from django.core.management.base import CommandError

from audit.actors import shell_operator
from catalog.keys import (
    LIMIT_FIELDS,
    LIMIT_FLAGS,
    counted_usage,
    open_model_names,
    team_limits,
    usage_rows,
)
from catalog.models import Team
from catalog.teams.actions import (
    create_team,
    delete_team,
    open_model,
    remove_member,
    set_role,
    update_team,
)  # fmt: skip
from catalog.teams.roles import ROLES, TeamRefused, find_team, key_cap
from core.tables import render_json, render_table
from protocol.rate_limits import team_counter_name


def add_parsers(subparsers) -> None:
    teams = subparsers.add_parser("teams", help="teams: budgets, members and their roles, models")
    verbs = teams.add_subparsers(dest="teams_verb", required=True, metavar="VERB")

    create = verbs.add_parser("create", help="make a team")
    create.add_argument("name", help="lowercase letters, digits and dashes")
    create.add_argument("--description", default="")
    _add_budgets(create)
    create.set_defaults(handler=create_command)

    update = verbs.add_parser("update", help="change a team's budgets or cap per key")
    update.add_argument("name")
    update.add_argument("--description")
    _add_budgets(update, clearing=True)
    update.set_defaults(handler=update_command)

    listing = verbs.add_parser("list", help="teams, their budgets, members and models")
    listing.add_argument("--json", action="store_true")
    listing.set_defaults(handler=list_command)

    show = verbs.add_parser("show", help="a team's budgets and what its keys spent of each")
    show.add_argument("name")
    show.add_argument("--json", action="store_true")
    show.set_defaults(handler=show_command)

    delete = verbs.add_parser("delete", help="remove a team that holds no keys")
    delete.add_argument("name")
    delete.set_defaults(handler=delete_command)

    add = verbs.add_parser("add-member", help="give a person a role in a team")
    add.add_argument("team")
    add.add_argument("username")
    add.add_argument("--role", choices=ROLES, default="member")
    add.set_defaults(handler=add_member_command)

    remove = verbs.add_parser("remove-member", help="take a person out of a team")
    remove.add_argument("team")
    remove.add_argument("username")
    remove.set_defaults(handler=remove_member_command)

    opening = verbs.add_parser("open", help="open a model to named teams only, or to all")
    opening.add_argument("model")
    to = opening.add_mutually_exclusive_group(required=True)
    to.add_argument("--to", help="comma-separated teams whose keys may use it")
    to.add_argument("--to-all", action="store_true", help="every team's keys may use it")
    opening.set_defaults(handler=open_command)


def _add_budgets(parser, clearing: bool = False) -> None:
    extra = "; none clears it" if clearing else ""
    for flag, field, counts in LIMIT_FLAGS:
        parser.add_argument(
            flag, dest=field, metavar="N", help=f"all its keys together: {counts}{extra}"
        )
        parser.add_argument(
            f"--key-{flag.removeprefix('--')}", dest=f"key_{field}", metavar="N",
            help=f"each key at most: {counts}{extra}",
        )  # fmt: skip


def _budgets(options) -> tuple[dict[str, int | None], dict[str, int | None]]:
    """The team's budgets and its cap per key, as the flags give them (None: `none`)."""
    limits: dict[str, int | None] = {}
    cap: dict[str, int | None] = {}
    for flag, field, _counts in LIMIT_FLAGS:
        for into, name, given in (
            (limits, field, flag),
            (cap, f"key_{field}", "--key-" + flag[2:]),
        ):
            value = options.get(name)
            if value is None:
                continue
            if value.strip().lower() == "none":
                into[field] = None
                continue
            try:
                into[field] = int(value)
            except ValueError:
                raise CommandError(f"{given} {value!r}: give a whole number, or none") from None
    return limits, cap


def create_command(options, out) -> None:
    limits, cap = _budgets(options)
    with _refusals():
        team = create_team(options["name"], description=options["description"], limits=limits,
                           key_cap=cap, actor=shell_operator())  # fmt: skip
    out.write(f"created team {team.name}: {_describe(team)}")


def update_command(options, out) -> None:
    limits, cap = _budgets(options)
    with _refusals():
        team = update_team(options["name"], description=options.get("description"),
                           limits=limits, key_cap=cap, actor=shell_operator())  # fmt: skip
    out.write(f"team {team.name}: {_describe(team)}")


def list_command(options, out) -> None:
    teams = list(Team.objects.prefetch_related("memberships__user"))
    usable = open_model_names()
    if options["json"]:
        out.write(render_json([_as_json(team, usable) for team in teams]))
        return
    rows = [
        [team.name, _describe(team), _members(team), _models(usable.get(team.name))]
        for team in teams
    ]
    out.write(render_table(["TEAM", "BUDGETS", "MEMBERS", "MODELS"], rows))


def show_command(options, out) -> None:
    with _refusals():
        team = find_team(options["name"])
    try:
        used = counted_usage(team_counter_name(team.name), time.time())
    except redis.RedisError as exc:
        raise CommandError(f"cannot read the routers' counters in Redis: {exc}") from None
    limits = team_limits(team).as_dict()
    if options["json"]:
        usage = {f: {"limit": limits.get(f), "used": used[f]} for f in LIMIT_FIELDS}
        out.write(render_json({**_as_json(team, open_model_names()), "usage": usage}))
        return
    out.write(f"team {team.name}: {_describe(team)}")
    out.write(f"members: {_members(team)}")
    out.write(f"models: {_models(open_model_names().get(team.name))}")
    rows = usage_rows(limits, used)
    out.write(render_table(["ALL KEYS TOGETHER", "AT MOST", "USED", "SHARE"], rows))


def delete_command(options, out) -> None:
    with _refusals():
        delete_team(options["name"], actor=shell_operator())
    out.write(f"removed team {options['name']}")


def add_member_command(options, out) -> None:
    with _refusals():
        held = set_role(options["team"], options["username"], options["role"],
                        actor=shell_operator())  # fmt: skip
    out.write(f"{options['username']} is {held.role} of team {options['team']}")


def remove_member_command(options, out) -> None:
    with _refusals():
        remove_member(options["team"], options["username"], actor=shell_operator())
    out.write(f"{options['username']} left team {options['team']}")


def open_command(options, out) -> None:
    names = [] if options["to_all"] else options["to"].split(",")
    with _refusals():
        teams = open_model(options["model"], names, actor=shell_operator())
    to = f"teams {', '.join(teams)}" if teams else "every team"
    out.write(f"model {options['model']} is open to {to}")


@contextmanager
def _refusals() -> Iterator[None]:
    """A verb's refusal as the command's error."""
    try:
        yield
    except TeamRefused as exc:
        raise CommandError(str(exc)) from None


def _describe(team: Team) -> str:
    terms = [f"{v} {k.replace('_', ' ')}" for k, v in team_limits(team).as_dict().items()]
    terms += [f"{v} {k.replace('_', ' ')} per key" for k, v in key_cap(team).as_dict().items()]
    return ", ".join(terms) or "no budgets"


def _members(team: Team) -> str:
    held = [f"{m.user.get_username()} ({m.role})" for m in team.memberships.all()]
    return ", ".join(held) or "none"


def _models(usable: set[str] | None) -> str:
    return "all" if usable is None else ", ".join(sorted(usable)) or "none"


def _as_json(team: Team, usable: dict[str, set[str] | None]) -> dict:
    names = usable.get(team.name)
    return {
        "name": team.name,
        "description": team.description,
        "limits": team_limits(team).as_dict(),
        "key_cap": key_cap(team).as_dict(),
        "members": {m.user.get_username(): m.role for m in team.memberships.all()},
        "models": sorted(names) if names is not None else "all",
    }
