"""Sign-in through an OpenID Connect provider (fleet.oidc), against a real one: the test
provider (tests/oidc_provider) in its own process. The browser's walk through it is
tests/pages/test_oidc_sign_in.py; here a test client plays the browser, and the provider's
own signing key forges what a browser cannot."""

from __future__ import annotations

import time
from urllib.parse import parse_qs, urlsplit

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from django.contrib.auth.models import Group, User
from django.core.exceptions import ImproperlyConfigured, SuspiciousOperation
from django.test import Client

from audit.models import Event, EventKind
from fleet.models import ProviderIdentity
from fleet.oidc import provider as oidc_provider
from fleet.oidc.backend import ProviderBackend, SignInRefused
from fleet.oidc.roles import claim_values, role_map, roles_from_claims
from tests.factories import make_user
from tests.oidc_provider.fixture import (
    ROLE_MAP,
    IdentityProvider,
    provider_password,
    start_test_provider,
)

CALLBACK = "http://testserver/accounts/oidc/callback/"


@pytest.fixture(scope="module")
def test_provider(tmp_path_factory):
    """One provider for the module: starting one costs a migrate."""
    started: list = []
    try:
        yield start_test_provider(started, tmp_path_factory.mktemp("provider"), [CALLBACK])
    finally:
        for process in reversed(started):
            process.stop()


@pytest.fixture
def idp(test_provider: IdentityProvider, settings, db) -> IdentityProvider:
    """llmgw configured to sign in through the test provider."""
    settings.OIDC_ISSUER = test_provider.issuer
    settings.OIDC_RP_CLIENT_ID = test_provider.client_id
    settings.OIDC_RP_CLIENT_SECRET = test_provider.client_secret
    settings.OIDC_PROVIDER_NAME = test_provider.name
    settings.OIDC_ROLE_MAP = ROLE_MAP.split(",")
    settings.AUTHENTICATION_BACKENDS = [
        "django.contrib.auth.backends.ModelBackend",
        "fleet.oidc.backend.ProviderBackend",
    ]
    oidc_provider.forget()
    yield test_provider
    oidc_provider.forget()


def at_provider(client: Client, username: str, next_url: str = "") -> str:
    """Start a sign-in at llmgw, sign in at the provider as ``username``; return the URL the
    provider sends the browser back to."""
    start = client.get("/accounts/oidc/start/" + (f"?next={next_url}" if next_url else ""))
    assert start.status_code == 302, start.content
    authorize = start["Location"]
    query = parse_qs(urlsplit(authorize).query)
    assert query["code_challenge_method"] == ["S256"] and query["code_challenge"]
    with httpx.Client(timeout=10) as browser:
        to_login = browser.get(authorize)
        assert to_login.status_code == 302
        login_url = httpx.URL(authorize).join(to_login.headers["location"])
        browser.get(login_url)
        answer = browser.post(
            login_url,
            data={
                "username": username,
                "password": provider_password(username),
                "csrfmiddlewaretoken": browser.cookies["provider_csrftoken"],
            },
            headers={"Referer": str(login_url)},
        )
        location = answer.headers["location"]
        while not location.startswith(CALLBACK):  # through /o/authorize/ back to llmgw
            answer = browser.get(httpx.URL(authorize).join(location))
            assert answer.status_code == 302, answer.text[:500]
            location = answer.headers["location"]
    return location


def sign_in(client: Client, username: str, next_url: str = ""):
    back = at_provider(client, username, next_url)
    return client.get(back.removeprefix("http://testserver"))


def page_error(client: Client, response) -> str:
    assert response.status_code == 302 and response["Location"] == "/accounts/login/"
    return client.get("/accounts/login/").content.decode()


def test_the_sign_in_page_offers_the_provider_only_when_one_is_set(idp, settings):
    assert "Sign in with Test IdP" in Client().get("/accounts/login/").content.decode()
    settings.OIDC_ISSUER = ""
    assert "Sign in with" not in Client().get("/accounts/login/").content.decode()
    assert Client().get("/accounts/oidc/start/").status_code == 404


def test_a_person_in_a_mapped_group_signs_in_with_its_roles(idp):
    client = Client()
    response = sign_in(client, "lena", next_url="/usage/")
    assert response.status_code == 302 and response["Location"] == "/usage/"
    user = User.objects.get(username="lena")
    assert client.session["_auth_user_id"] == str(user.pk)
    assert sorted(user.groups.values_list("name", flat=True)) == ["operators", "playground"]
    assert user.email == "lena@example.test" and not user.has_usable_password()
    identity = ProviderIdentity.objects.get(user=user)
    assert identity.issuer == idp.issuer and identity.last_sign_in_at is not None
    reasons = list(Event.objects.filter(kind=EventKind.SIGN_IN, subject="lena")
                   .order_by("id").values_list("reason", flat=True))  # fmt: skip
    assert reasons[0].startswith("account made at the first sign-in through Test IdP")
    assert reasons[1] == "roles from Test IdP: operators, playground (were none)"
    assert reasons[2] == "signed in through Test IdP from 127.0.0.1"
    # The next sign-in finds the same account, roles unchanged, so no role Event.
    sign_in(Client(), "lena")
    assert User.objects.filter(username__startswith="lena").count() == 1
    assert Event.objects.filter(reason__startswith="roles from").count() == 1


def test_roles_follow_the_map_at_each_sign_in_and_leave_other_groups_alone(idp, settings):
    sign_in(Client(), "lena")
    user = User.objects.get(username="lena")
    user.groups.add(Group.objects.create(name="an-admin-s-own-group"))
    settings.OIDC_ROLE_MAP = ["llm-ops=engine-admin"]
    sign_in(Client(), "lena")
    assert sorted(user.groups.values_list("name", flat=True)) == [
        "an-admin-s-own-group", "engine-admin",
    ]  # fmt: skip
    change = Event.objects.filter(reason__startswith="roles from").latest("id")
    assert change.reason == "roles from Test IdP: engine-admin (were operators, playground)"


def test_a_reader_signs_in_with_no_group(idp):
    client = Client()
    sign_in(client, "rita")
    user = User.objects.get(username="rita")
    assert client.session["_auth_user_id"] == str(user.pk)
    assert not user.groups.exists()


def test_a_person_whose_groups_map_to_no_role_is_refused_saying_so(idp):
    client = Client()
    page = page_error(client, sign_in(client, "otto"))
    assert (
        "Sign-in with Test IdP refused: your account there holds no role here: its groups "
        "claim (sales) matches no entry of LLMGW_OIDC_ROLE_MAP; ask an operator." in page
    )
    assert "_auth_user_id" not in client.session
    assert not User.objects.filter(username="otto").exists()
    refused = Event.objects.get(kind=EventKind.SIGN_IN, to_state="refused")
    assert refused.subject == "Test IdP sign-in" and "holds no role" in refused.reason


def test_an_answer_this_browser_did_not_start_is_refused(idp):
    # Another browser's (an attacker's) code and state, handed to this one in a link.
    attacker = Client()
    back = at_provider(attacker, "lena")
    victim = Client()
    page = page_error(victim, victim.get(back.removeprefix("http://testserver")))
    assert "does not belong to a sign-in started from this browser" in page
    assert "_auth_user_id" not in victim.session
    # And a code made up: the same, before the provider is even asked.
    made_up = victim.get("/accounts/oidc/callback/?code=forged&state=forged")
    assert "does not belong to a sign-in" in page_error(victim, made_up)
    assert not User.objects.filter(username="lena").exists()
    # An answer used once cannot be used again.
    owner = Client()
    back = at_provider(owner, "lena")
    assert owner.get(back.removeprefix("http://testserver")).status_code == 302
    owner.logout()
    assert "does not belong" in page_error(owner, owner.get(back.removeprefix("http://testserver")))


def test_the_provider_holds_the_code_to_its_pkce_challenge(idp):
    # A code stolen on its way back is no use without the verifier this session kept.
    client = Client()
    back = at_provider(client, "lena")
    state = parse_qs(urlsplit(back).query)["state"][0]
    session = client.session
    session["oidc_states"][state]["code_verifier"] = "a-verifier-that-is-not-the-one" * 2
    session.save()
    page = page_error(client, client.get(back.removeprefix("http://testserver")))
    assert "Sign-in with Test IdP refused: the provider refused to complete it" in page
    assert "invalid_grant" in page
    assert not User.objects.filter(username="lena").exists()


def test_the_provider_saying_no_is_shown(idp):
    client = Client()
    start = client.get("/accounts/oidc/start/")
    state = parse_qs(urlsplit(start["Location"]).query)["state"][0]
    response = client.get(
        f"/accounts/oidc/callback/?error=access_denied&error_description=User+said+no&state={state}"
    )
    page = page_error(client, response)
    assert "the provider did not sign you in (access_denied: User said no)" in page
    assert state not in client.session.get("oidc_states", {})


def test_a_local_account_of_the_same_name_is_never_taken_over(idp):
    local = make_user("lena", operator=False)
    client = Client()
    sign_in(client, "lena")
    arrived = User.objects.get(pk=client.session["_auth_user_id"])
    assert arrived.username == "lena-2" and arrived.pk != local.pk
    assert not local.groups.exists()
    # The local account still signs in with its password.
    assert Client().login(username="lena", password="pw-lena")


def test_a_disabled_account_is_signed_out_and_refused(idp):
    client = Client()
    sign_in(client, "lena")
    User.objects.filter(username="lena").update(is_active=False)
    assert client.get("/").status_code == 302  # the session no longer signs anyone in
    page = page_error(client, sign_in(client, "lena"))
    assert "refused: the account lena is disabled here." in page
    assert client.get("/").status_code == 302


def test_password_sign_in_never_asks_the_provider(idp, settings):
    make_user("olga", operator=True)
    settings.OIDC_ISSUER = "http://127.0.0.1:9/o"  # nothing listens there
    oidc_provider.forget()
    client = Client()
    response = client.post("/accounts/login/", {"username": "olga", "password": "pw-olga"})
    assert response.status_code == 302 and "_auth_user_id" in client.session


def id_token(key: rsa.RSAPrivateKey, kid: str, **claims) -> str:
    now = int(time.time())
    body = {"iat": now, "exp": now + 300, "sub": "1", "nonce": "n", **claims}
    return jwt.encode(body, key, algorithm="RS256", headers={"kid": kid})


def test_an_id_token_not_signed_by_the_provider_or_not_for_us_does_not_verify(idp):
    kid = httpx.get(oidc_provider.endpoints().jwks_uri).json()["keys"][0]["kid"]
    right = {"iss": idp.issuer, "aud": idp.client_id}
    backend = ProviderBackend()
    assert backend.verify_token(id_token(idp.signing_key, kid, **right), nonce="n")["sub"] == "1"

    forger = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    with pytest.raises(SuspiciousOperation, match="verification failed"):
        backend.verify_token(id_token(forger, kid, **right), nonce="n")
    with pytest.raises(SignInRefused, match="issued by 'http://elsewhere'"):
        backend.verify_token(id_token(idp.signing_key, kid, **{**right, "iss": "http://elsewhere"}),
                             nonce="n")  # fmt: skip
    with pytest.raises(SignInRefused, match="meant for \\['another-client'\\]"):
        backend.verify_token(id_token(idp.signing_key, kid, **{**right, "aud": "another-client"}),
                             nonce="n")  # fmt: skip
    with pytest.raises(SuspiciousOperation, match="Nonce"):
        backend.verify_token(id_token(idp.signing_key, kid, **right), nonce="another")
    with pytest.raises(jwt.ExpiredSignatureError):
        backend.verify_token(id_token(idp.signing_key, kid, **right, exp=int(time.time()) - 600),
                             nonce="n")  # fmt: skip


def test_discovery_must_name_the_issuer_asked_for(idp):
    with pytest.raises(oidc_provider.ProviderUnavailable, match="names the issuer"):
        oidc_provider.discover(idp.issuer.replace("localhost", "127.0.0.1"))


def test_a_provider_over_plain_http_must_be_on_loopback():
    with pytest.raises(oidc_provider.ProviderUnavailable, match="not https"):
        oidc_provider.discover("http://sso.example.com")


def test_roles_come_from_the_claim_through_the_map(settings):
    mapping = role_map(["llm-ops=operators", "llm-ops=playground", "gpu=engine-admin",
                        "everyone=reader"])  # fmt: skip
    assert roles_from_claims({"groups": ["llm-ops", "other"]}, mapping) == {
        "operators", "playground",
    }  # fmt: skip
    assert roles_from_claims({"groups": "gpu"}, mapping) == {"engine-admin"}
    assert roles_from_claims({"groups": 7}, mapping) == set()
    settings.OIDC_ROLES_CLAIM = "realm_access.roles"
    assert claim_values({"realm_access": {"roles": ["everyone"]}}) == ["everyone"]
    assert roles_from_claims({"realm_access": {"roles": ["everyone"]}}, mapping) == {"reader"}
    with pytest.raises(ImproperlyConfigured, match="'llm-ops=root'"):
        role_map(["llm-ops=root"])
    with pytest.raises(ImproperlyConfigured, match="'operators'"):
        role_map(["operators"])


def test_a_group_that_maps_to_a_team_lead_signs_in_as_that_teams_lead(idp, settings):
    """Teams (issue 43): lena's `staff` group makes her red's lead; she sees red's keys
    through the API with the session the sign-in gave her, and none of blue's."""
    from catalog.actions.api_keys import create_key
    from catalog.models import Membership
    from catalog.teams.actions import create_team
    from tests.factories import SETUP

    settings.OIDC_ROLE_MAP = ["staff=team:red:lead", "readers=team:red:viewer"]
    create_team("red", actor=SETUP)
    create_team("blue", actor=SETUP)
    create_key("red-svc", team="red", actor=SETUP)
    create_key("blue-svc", team="blue", actor=SETUP)
    client = Client()
    sign_in(client, "lena")
    lena = User.objects.get(username="lena")
    assert Membership.objects.get(team__name="red", user=lena).role == "lead"
    assert not lena.groups.exists()  # a team's lead, no fleet-wide role
    keys = client.get("/api/v1/keys/").json()["results"]
    assert [key["name"] for key in keys] == ["red-svc"]
    assert [team["name"] for team in client.get("/api/v1/teams/").json()["results"]] == ["red"]
