"""Teams: the verbs (each an Event naming who acted, refusals that name the fix), what
routers load of a key's team, and who may do what through the REST API: a lead manages
their team's keys and members and sees no other team's keys, a member makes keys for
themselves within the team's cap, a viewer only looks."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from audit.models import Event, EventKind
from catalog.actions.api_keys import create_key
from catalog.keys import ApiKeyRefused, active_keys
from catalog.models import ApiKey, Membership, Team
from catalog.teams.actions import (
    create_team,
    delete_team,
    open_model,
    remove_member,
    set_role,
    update_team,
)  # fmt: skip
from catalog.teams.roles import RoleRequired, TeamRefused
from tests.factories import SETUP, make_model, make_user

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def default_team(db):
    """``default``, as the migration made it: a test before this one that flushed the
    database (transaction=True) took it with everything else."""
    return Team.objects.get_or_create(name="default")[0]


@pytest.fixture
def teams(db):
    """Two teams with a lead, a member and a viewer in ``red``; a lead in ``blue``."""
    red = create_team("red", limits={"tokens_per_day": 1000}, key_cap={"tokens_per_day": 300},
                      actor=SETUP)  # fmt: skip
    blue = create_team("blue", actor=SETUP)
    people = {name: make_user(name) for name in ("lena", "mo", "vic", "bea")}
    set_role("red", "lena", "lead", actor=SETUP)
    set_role("red", "mo", "member", actor=SETUP)
    set_role("red", "vic", "viewer", actor=SETUP)
    set_role("blue", "bea", "lead", actor=SETUP)
    return red, blue, people


def loaded(name: str) -> dict:
    return next(k for k in active_keys() if k["name"] == name)


def test_a_team_is_made_with_budgets_and_a_cap_and_recorded(teams):
    red, _blue, _people = teams
    assert (red.tokens_per_day, red.key_cap) == (1000, {"tokens_per_day": 300})
    made = Event.objects.get(kind=EventKind.TEAM, subject="red", reason__startswith="created")
    assert "1000 tokens per day" in made.reason and "300 tokens per day per key" in made.reason
    roles = Event.objects.filter(kind=EventKind.TEAM, subject="red").values_list(
        "reason", flat=True
    )
    assert "lena joined as lead" in roles


def test_bad_team_names_and_limits_are_refused_with_the_fix(db):
    with pytest.raises(TeamRefused, match="lowercase letters"):
        create_team("Red Team", actor=SETUP)
    with pytest.raises(ApiKeyRefused, match="tokens_per_day: 0 is not a limit"):
        create_team("red", limits={"tokens_per_day": 0}, actor=SETUP)
    create_team("red", actor=SETUP)
    with pytest.raises(TeamRefused, match="exists already"):
        create_team("red", actor=SETUP)


def test_only_operators_make_teams_and_open_models(teams, operator):
    _red, _blue, people = teams
    with pytest.raises(RoleRequired, match="operator"):
        create_team("green", actor=people["lena"])
    with pytest.raises(RoleRequired, match="operator"):
        update_team("red", limits={"tokens_per_day": 10**9}, actor=people["lena"])
    make_model("gemma")
    with pytest.raises(RoleRequired):
        open_model("gemma", ["red"], actor=people["lena"])
    assert create_team("green", actor=operator).name == "green"


def test_a_lead_gives_roles_in_their_team_only_and_keeps_a_lead(teams):
    _red, _blue, people = teams
    set_role("red", "vic", "member", actor=people["lena"])
    assert Membership.objects.get(team__name="red", user__username="vic").role == "member"
    with pytest.raises(RoleRequired, match="needs its lead role"):
        set_role("blue", "mo", "lead", actor=people["lena"])
    with pytest.raises(RoleRequired, match="you are its member"):
        set_role("red", "mo", "lead", actor=people["mo"])
    with pytest.raises(TeamRefused, match="without a lead"):
        set_role("red", "lena", "member", actor=people["lena"])
    remove_member("red", "vic", actor=people["lena"])
    assert not Membership.objects.filter(team__name="red", user__username="vic").exists()


def test_a_team_with_keys_or_the_default_team_is_not_removed(teams):
    create_key("svc", team="red", actor=SETUP)
    with pytest.raises(TeamRefused, match="holds 1 key"):
        delete_team("red", actor=SETUP)
    with pytest.raises(TeamRefused, match="stays"):
        delete_team("default", actor=SETUP)
    delete_team("blue", actor=SETUP)


def test_a_key_without_a_team_is_the_default_teams_and_loads_as_before(db):
    make_model("gemma")
    row, _key = create_key("svc", ["gemma"], limits={"tokens_per_day": 500}, actor=SETUP)
    assert row.team.name == "default"
    key = loaded("svc")
    assert (key["team"], key["team_limits"], key["team_models"]) == ("default", {}, None)
    assert key["limits"]["tokens_per_day"] == 500 and key["capped"] == []


def test_routers_load_a_keys_team_budgets_cap_and_models(teams):
    make_model("gemma", aliases=["g"])
    make_model("qwen")
    open_model("qwen", ["blue"], actor=SETUP)
    create_key("red-svc", team="red", limits={"tokens_per_day": 5000}, actor=SETUP)
    create_key("blue-svc", team="blue", actor=SETUP)
    red, blue = loaded("red-svc"), loaded("blue-svc")
    assert red["team_limits"] == {"tokens_per_day": 1000}
    assert red["limits"]["tokens_per_day"] == 300 and red["capped"] == ["tokens_per_day"]
    assert red["team_models"] == ["g", "gemma"]  # qwen is blue's alone
    assert blue["team_models"] == ["g", "gemma", "qwen"]
    open_model("qwen", [], actor=SETUP)  # open to all again
    assert loaded("red-svc")["team_models"] is None


def test_a_key_cannot_name_a_model_closed_to_its_team(teams):
    make_model("qwen")
    open_model("qwen", ["blue"], actor=SETUP)
    with pytest.raises(ApiKeyRefused, match="not open to team red"):
        create_key("svc", ["qwen"], team="red", actor=SETUP)


def test_opening_a_model_is_recorded_and_unknown_names_are_refused(teams):
    make_model("qwen")
    assert open_model("qwen", ["red", "blue"], actor=SETUP) == ["blue", "red"]
    assert Event.objects.filter(kind=EventKind.TEAM, subject="qwen",
                                reason__contains="opened to teams blue, red").exists()  # fmt: skip
    with pytest.raises(TeamRefused, match="no team 'nope'"):
        open_model("qwen", ["nope"], actor=SETUP)
    with pytest.raises(TeamRefused, match="no model 'nope'"):
        open_model("nope", ["red"], actor=SETUP)


# --- The REST API: who may do what ----------------------------------------------------


def test_a_lead_manages_their_teams_keys_and_sees_no_other_teams(api_client, teams):
    _red, _blue, people = teams
    create_key("blue-secret", team="blue", actor=SETUP)
    api_client.force_authenticate(people["lena"])
    made = api_client.post("/api/v1/keys/", {"name": "red-svc", "team": "red",
                                             "member": "mo"}, format="json")  # fmt: skip
    assert made.status_code == 201, made.json()
    assert made.json()["team"] == "red" and made.json()["member"] == "mo"
    names = [k["name"] for k in api_client.get("/api/v1/keys/").json()["results"]]
    assert names == ["red-svc"]
    blue_key = ApiKey.objects.get(name="blue-secret")
    assert api_client.get(f"/api/v1/keys/{blue_key.id}/").status_code == 404
    assert api_client.post(f"/api/v1/keys/{blue_key.id}/revoke/").status_code == 404
    refused = api_client.post("/api/v1/keys/", {"name": "x", "team": "blue"}, format="json")
    assert refused.status_code == 403 and "needs its member role" in str(refused.json())
    outsider = api_client.post("/api/v1/keys/", {"name": "x", "team": "red", "member": "bea"},
                               format="json")  # fmt: skip
    assert outsider.status_code == 400 and "bea is not in team red" in str(outsider.json())
    changed = api_client.patch(f"/api/v1/keys/{made.json()['id']}/", {"tokens_per_day": 900},
                               format="json")  # fmt: skip
    assert changed.status_code == 200  # a lead may go past the cap: the cap still applies
    assert loaded("red-svc")["limits"]["tokens_per_day"] == 300
    members = api_client.post("/api/v1/teams/red/members/", {"username": "vic", "role": "member"},
                              format="json")  # fmt: skip
    assert members.status_code == 200
    assert {"username": "vic", "role": "member"} in members.json()["members"]
    assert [t["name"] for t in api_client.get("/api/v1/teams/").json()["results"]] == ["red"]


def test_a_member_makes_keys_for_themselves_within_the_cap(api_client, teams):
    _red, _blue, people = teams
    api_client.force_authenticate(people["mo"])
    made = api_client.post("/api/v1/keys/", {"name": "mine", "team": "red", "member": "lena"},
                           format="json")  # fmt: skip
    assert made.status_code == 201 and made.json()["member"] == "mo"  # theirs, whatever asked
    over = api_client.post("/api/v1/keys/", {"name": "big", "team": "red",
                                             "tokens_per_day": 301}, format="json")  # fmt: skip
    assert over.status_code == 400
    assert "over team red's cap of 300 per key" in str(over.json()["tokens_per_day"])
    lead_key, _ = create_key("leads", team="red", member=people["lena"], actor=SETUP)
    assert api_client.post(f"/api/v1/keys/{lead_key.id}/revoke/").status_code == 403
    assert api_client.post(f"/api/v1/keys/{made.json()['id']}/revoke/").status_code == 200
    assert api_client.post("/api/v1/teams/red/members/", {"username": "vic", "role": "lead"},
                           format="json").status_code == 403  # fmt: skip


def test_a_viewer_only_sees(api_client, teams):
    _red, _blue, people = teams
    create_key("red-svc", team="red", actor=SETUP)
    api_client.force_authenticate(people["vic"])
    assert [k["name"] for k in api_client.get("/api/v1/keys/").json()["results"]] == ["red-svc"]
    refused = api_client.post("/api/v1/keys/", {"name": "x", "team": "red"}, format="json")
    assert refused.status_code == 403 and "you are its viewer" in str(refused.json())
    key = ApiKey.objects.get(name="red-svc")
    assert api_client.patch(f"/api/v1/keys/{key.id}/", {"tokens_per_day": 1},
                            format="json").status_code == 403  # fmt: skip
    team = api_client.get("/api/v1/teams/red/").json()
    assert team["tokens_per_day"] == 1000 and team["models"] == "all"


def test_an_operator_makes_teams_and_opens_models_through_the_api(api_client, operator):
    api_client.force_authenticate(operator)
    made = api_client.post("/api/v1/teams/", {"name": "green", "tokens_per_day": 100,
                                              "key_cap": {"requests_per_minute": 5}},
                           format="json")  # fmt: skip
    assert made.status_code == 201, made.json()
    assert made.json()["key_cap"] == {"requests_per_minute": 5}
    model = make_model("qwen")
    opened = api_client.post(f"/api/v1/models/{model.id}/teams/", {"teams": ["green"]},
                             format="json")  # fmt: skip
    assert opened.json() == {"model": "qwen", "teams": ["green"]}
    assert api_client.get("/api/v1/teams/green/").json()["models"] == ["qwen"]
    assert api_client.get("/api/v1/teams/default/").json()["models"] == []


@pytest.mark.django_db(transaction=True)
def test_keys_from_before_teams_move_to_the_default_team_unchanged():
    executor = MigrationExecutor(connection)
    executor.migrate([("catalog", "0009_playground_keys")])
    old = executor.loader.project_state([("catalog", "0009_playground_keys")]).apps
    OldKey = old.get_model("catalog", "ApiKey")
    OldKey.objects.create(name="legacy", prefix="llmgw-legacy01", hashed_key="h" * 64,
                          tokens_per_day=700, allowed_models=[])  # fmt: skip

    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())

    key = ApiKey.objects.get(prefix="llmgw-legacy01")
    assert key.team.name == "default" and key.tokens_per_day == 700
    legacy = loaded("legacy")
    assert legacy["limits"]["tokens_per_day"] == 700
    assert (legacy["team_limits"], legacy["team_models"], legacy["capped"]) == ({}, None, [])


# --- llmgw_ctl and the ledger -----------------------------------------------------------


def test_llmgw_ctl_makes_a_team_gives_roles_opens_models_and_makes_its_keys(db):
    from django.core.management.base import CommandError

    from tests.ctl import ctl

    make_user("lena")
    make_model("qwen")
    said = ctl("teams", "create", "research", "--tokens-per-day", "5000",
               "--key-tokens-per-day", "500")  # fmt: skip
    assert "5000 tokens per day, 500 tokens per day per key" in said
    assert "lena is lead of team research" in ctl("teams", "add-member", "research", "lena",
                                                 "--role", "lead")  # fmt: skip
    assert "open to teams research" in ctl("teams", "open", "qwen", "--to", "research")
    assert "in team research" in ctl("keys", "create", "svc", "--team", "research",
                                     "--member", "lena")  # fmt: skip
    listing = ctl("teams", "list")
    assert "lena (lead)" in listing and "qwen" in listing
    assert "tokens per UTC day" in ctl("teams", "show", "research")
    assert "research" in ctl("keys", "list")
    assert ctl("teams", "update", "research", "--key-tokens-per-day", "none").endswith(
        "5000 tokens per day\n"
    )
    with pytest.raises(CommandError, match="holds 1 key"):
        ctl("teams", "delete", "research")
    with pytest.raises(CommandError, match="--key-rpm 'x'"):
        ctl("teams", "update", "research", "--key-rpm", "x")


def test_a_teams_ledger_is_every_key_it_held_revoked_ones_too(teams):
    from datetime import UTC, datetime

    from catalog.actions.api_keys import revoke_key
    from protocol.rate_limits import day_starts, month_starts, team_counter_name
    from router.models import Usage
    from router.usage.accounting import ledger_totals

    kept, _ = create_key("kept", team="red", actor=SETUP)
    gone, _ = create_key("gone", team="red", actor=SETUP)
    elsewhere, _ = create_key("elsewhere", team="blue", actor=SETUP)
    revoke_key(gone.prefix, actor=SETUP)
    now = datetime.now(tz=UTC).replace(minute=0, second=0, microsecond=0)
    for key, tokens in ((kept, 30), (gone, 12), (elsewhere, 1000)):
        Usage.objects.create(hour=now, key_prefix=key.prefix, key_name=key.name, model="m",
                             requests=1, prompt_tokens=tokens)  # fmt: skip
    moment = now.timestamp() + 1  # within the hour the rows are for
    day, month = ledger_totals(team_counter_name("red"), day_starts(moment), month_starts(moment))
    assert (day, month) == (42, 42)
    assert ledger_totals(kept.prefix, day_starts(moment), month_starts(moment)) == (30, 30)


def test_the_playground_offers_only_models_open_to_the_default_team(teams):
    from catalog.playground import PlaygroundRules, playground_models

    make_model("gemma")
    make_model("qwen")
    open_model("qwen", ["red"], actor=SETUP)
    rules = PlaygroundRules(group="playground", lifetime=3600)
    assert playground_models(rules) == ["gemma"]  # its keys are default's


# --- Roles from the identity provider's claim -------------------------------------------


def test_the_providers_claim_gives_team_roles_in_the_teams_its_map_names(teams):
    from django.core.exceptions import ImproperlyConfigured

    from catalog.teams.actions import set_provider_team_roles
    from fleet.oidc.roles import mapped_teams, role_map, roles_from_claims, team_roles

    mapping = role_map(["ml-leads=team:red:lead", "ml=team:red:member", "ml=reader",
                        "infra=team:blue:viewer", "ghost=team:nowhere:member"])  # fmt: skip
    with pytest.raises(ImproperlyConfigured, match="team:NAME:ROLE"):
        role_map(["ml=team:red:boss"])
    assert mapped_teams(mapping) == {"red", "blue", "nowhere"}
    roles = roles_from_claims({"groups": ["ml", "ml-leads", "ghost"]}, mapping)
    assert team_roles(roles) == {"red": "lead", "nowhere": "member"}  # the highest of two

    pia = make_user("pia")
    set_provider_team_roles(pia, team_roles(roles), mapped_teams(mapping), provider="corp",
                            actor=SETUP)  # fmt: skip
    assert Membership.objects.get(team__name="red", user=pia).role == "lead"
    assert Event.objects.filter(subject="nowhere", reason__contains="does not exist").exists()
    # A lead outside the map's teams gives pia a role there; the provider leaves it alone.
    set_role("blue", "pia", "member", actor=SETUP)
    later = roles_from_claims({"groups": ["ml"]}, mapping)  # no longer in ml-leads
    set_provider_team_roles(pia, team_roles(later), {"red"}, provider="corp", actor=SETUP)
    assert Membership.objects.get(team__name="red", user=pia).role == "member"
    assert Membership.objects.get(team__name="blue", user=pia).role == "member"
    set_provider_team_roles(pia, {}, {"red"}, provider="corp", actor=SETUP)
    assert not Membership.objects.filter(team__name="red", user=pia).exists()
    assert Event.objects.filter(subject="red", reason__contains="corp no longer says so").exists()
