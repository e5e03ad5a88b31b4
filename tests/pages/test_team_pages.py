"""The team pages over HTTP: who sees a team (its members, operators; 404 to anyone else),
what it shows (members, budgets, cap, only its models, its keys but never a key, its usage
per model over the last day), who makes and revokes keys from it, and where a sign-in
lands. The browser's walk is in test_team_browser."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from catalog.actions.api_keys import create_key
from catalog.models import ApiKey, Membership, Team
from router.models import Usage
from tests.factories import make_model, make_user

pytestmark = pytest.mark.django_db


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def red(db):
    """Team red: lena leads it, mia is a member, vic a viewer; qwen is open to it alone,
    gemma to every team; blue is another team with a key of its own."""
    team = Team.objects.create(name="red", tokens_per_day=5000, key_cap={"tokens_per_day": 300})
    blue = Team.objects.create(name="blue")
    for name, role in (("lena", "lead"), ("mia", "member"), ("vic", "viewer")):
        Membership.objects.create(team=team, user=make_user(name), role=role)
    make_model("gemma")
    make_model("qwen", source="/models/qwen.gguf").teams.add(team)
    make_model("llama", source="/models/llama.gguf").teams.add(blue)
    return team


def user(name: str):
    return Membership.objects.get(user__username=name).user


def test_a_member_sees_the_team_its_models_keys_and_usage_and_never_a_key(red):
    row, key = create_key("ci", team=red, actor=user("lena"))
    blue_row, _ = create_key("blue-ci", team="blue", actor=user("lena"))
    now = timezone.now().replace(minute=0, second=0, microsecond=0)
    Usage.objects.create(hour=now, key_prefix=row.prefix, key_name="ci", model="qwen",
                         requests=3, prompt_tokens=30, completion_tokens=12)  # fmt: skip
    Usage.objects.create(hour=now - timedelta(hours=2), key_prefix=row.prefix, key_name="ci",
                         model="qwen", requests=2, prompt_tokens=20,
                         completion_tokens=8)  # fmt: skip
    Usage.objects.create(hour=now - timedelta(days=2), key_prefix=row.prefix, key_name="ci",
                         model="gemma", requests=9, prompt_tokens=90)  # fmt: skip
    Usage.objects.create(hour=now, key_prefix=blue_row.prefix, key_name="blue-ci",
                         model="llama", requests=7, prompt_tokens=70)  # fmt: skip
    client = signed_in(user("vic"))

    page = client.get("/teams/red/").content.decode()
    assert "You are its viewer." in page
    for name in ("lena", "mia", "vic"):
        assert f'data-member="{name}"' in page
    assert '<td class="budget">5000</td><td class="cap">300</td>' in page
    assert 'data-model="qwen"' in page and 'data-model="gemma"' in page
    assert 'data-model="llama"' not in page  # open to blue alone
    assert f'data-key="{row.prefix}"' in page and f'data-key="{blue_row.prefix}"' not in page
    assert key not in page and row.hashed_key not in page
    assert "new-key-form" not in page  # a viewer only looks

    usage = client.get("/usage/teams/red/").content.decode()
    assert "5 requests, 70 tokens in the last 24 hours" in usage
    assert '<tr data-model="qwen"><td>qwen</td><td>5</td><td>50</td><td>20</td>' in usage
    assert "gemma" not in usage and "llama" not in usage


def test_a_team_is_hidden_from_whoever_is_not_in_it(red):
    stranger = signed_in(make_user("sam"))
    for path in ("/teams/red/", "/usage/teams/red/", "/teams/nope/"):
        assert stranger.get(path).status_code == 404
    assert stranger.post("/teams/red/keys/", {"name": "x"}).status_code == 404
    assert "You are in no team yet" in stranger.get("/teams/").content.decode()
    listed = signed_in(user("mia")).get("/teams/").content.decode()
    assert 'data-team="red"' in listed and 'data-team="blue"' not in listed
    everyone = signed_in(make_user("olga", operator=True)).get("/teams/").content.decode()
    assert 'data-team="red"' in everyone and 'data-team="blue"' in everyone
    assert signed_in(make_user("oleg", operator=True)).get("/teams/blue/").status_code == 200


def test_a_lead_makes_a_key_for_a_member_shown_once(red):
    client = signed_in(user("lena"))
    asked = {"name": "mia-laptop", "member": "mia", "models": ["qwen"], "tokens_per_day": "1000"}
    answer = client.post("/teams/red/keys/", asked)
    assert answer.status_code == 201
    made = ApiKey.objects.get(name="mia-laptop")
    assert (made.team, made.member, made.allowed_models) == (red, user("mia"), ["qwen"])
    assert made.tokens_per_day == 1000  # a lead is not held to the cap when making it
    shown = answer.content.decode()
    key = shown.split('<code id="new-key-value">')[1].split("<")[0]
    assert key.startswith(made.prefix)
    assert key not in client.get("/teams/red/").content.decode()

    # A model closed to the team cannot be named; the refusal says so on the page.
    refused = client.post("/teams/red/keys/", {"name": "x", "models": ["llama"]})
    assert refused.status_code == 400
    assert "not open to team red" in refused.content.decode()


def test_a_member_makes_keys_for_themselves_within_the_cap_and_a_viewer_none(red):
    mia = signed_in(user("mia"))
    made = mia.post("/teams/red/keys/", {"name": "mine", "member": "lena"})
    assert made.status_code == 201
    assert ApiKey.objects.get(name="mine").member == user("mia")  # not lena's
    over = mia.post("/teams/red/keys/", {"name": "big", "tokens_per_day": "301"})
    assert over.status_code == 400
    assert "tokens_per_day: 301 is over team red&#x27;s cap of 300 per key" in over.content.decode()

    viewer = signed_in(user("vic")).post("/teams/red/keys/", {"name": "peek"})
    assert viewer.status_code == 403
    assert "needs its member role or higher (you are its viewer)" in viewer.content.decode()
    assert not ApiKey.objects.filter(name__in=["big", "peek"]).exists()


def test_who_may_revoke_which_key(red):
    teams_key, _ = create_key("ci", team=red, actor=user("lena"))
    mias_key, _ = create_key("mine", team=red, member=user("mia"), actor=user("lena"))
    mia = signed_in(user("mia"))
    page = mia.get("/teams/red/").content.decode()
    assert page.count('class="action revoke"') == 1  # her own key only

    refused = mia.post(f"/teams/red/keys/{teams_key.prefix}/revoke/")
    assert refused.status_code == 403
    revoked = mia.post(f"/teams/red/keys/{mias_key.prefix}/revoke/", follow=True)
    assert f"Revoked mine&#x27;s key {mias_key.prefix}…" in revoked.content.decode()
    lena = signed_in(user("lena"))
    assert lena.post(f"/teams/red/keys/{teams_key.prefix}/revoke/").status_code == 302
    revoked = ApiKey.objects.filter(revoked_at__isnull=False).values_list("name", flat=True)
    assert sorted(revoked) == ["ci", "mine"]


def sign_in(username: str, path: str = "/accounts/login/") -> str:
    answer = Client().post(path, {"username": username, "password": f"pw-{username}"})
    assert answer.status_code == 302, answer.content.decode()
    return answer["Location"]


def test_a_sign_in_in_one_team_lands_on_its_page(red):
    assert sign_in("mia") == "/teams/red/"
    assert sign_in("mia", "/accounts/login/?next=/usage/") == "/usage/"  # next= still wins
    Membership.objects.create(team=Team.objects.get(name="blue"), user=user("vic"))
    assert sign_in("vic") == "/"  # two teams: the cluster, with Teams in the menu
    Membership.objects.create(team=red, user=make_user("olga", operator=True))
    assert sign_in("olga") == "/"
    make_user("sam")
    assert sign_in("sam") == "/"
