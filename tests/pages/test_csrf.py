"""Every action needs the page's CSRF token, and every operator action says who made it.

The walk goes over every URL pattern the project has, so a view added later without CSRF
(or with ``csrf_exempt``) fails here without anyone having to remember this file.
"""

from __future__ import annotations

import itertools

import pytest
from django.test import Client
from django.urls import Resolver404, URLResolver, get_resolver, resolve
from django.utils.regex_helper import normalize

from audit.models import Event
from catalog.models import ApiKey
from fleet.models import Node
from tests.pages.rows import heartbeating_node, stale_replica_on

pytestmark = pytest.mark.django_db

UNSAFE_METHODS = ("post", "put", "patch", "delete")


@pytest.fixture
def fleet():
    node = heartbeating_node("node01")
    profile, stale, _fetching, _unplaceable = stale_replica_on(node)
    return {"node": node, "profile": profile, "stale": stale}


def samples(fleet) -> dict[str, tuple[str, ...]]:
    """Values to try for each URL parameter the project's patterns take, by its name."""
    return {
        "node_id": ("node01",),
        "replica_id": (str(fleet["stale"].id),),
        "profile_id": (str(fleet["profile"].id),),
        "model_id": (str(fleet["profile"].model_id),),
        "name": ("gemma",),
        "pk": ("1",),
        # DRF's suffix patterns: a regex group after the dot, or a converter with the dot.
        "format": ("json", ".json"),
        # The admin's own patterns.
        "app_label": ("fleet",),
        "object_id": ("node01",),
        "id": ("1",),
        "content_type_id": ("1",),
        "url": ("anywhere/",),
        "username": ("olga",),  # a team member (/api/v1/teams/NAME/members/USERNAME/)
        "prefix": ("llmgw-00000000",),  # a team's key (/teams/NAME/keys/PREFIX/revoke/)
    }


def every_pattern(patterns=None, prefix: str = ""):
    """(format string, parameter names) of every URL pattern, through every include: the
    admin's unnamed redirects too, which is why this reads the regexes, not the names."""
    for pattern in get_resolver().url_patterns if patterns is None else patterns:
        ((path, parameters),) = normalize(pattern.pattern.regex.pattern)[:1]
        if isinstance(pattern, URLResolver):
            yield from every_pattern(pattern.url_patterns, prefix + path)
        else:
            yield prefix + path, parameters


def every_url(fleet) -> list[str]:
    """A URL that resolves for each pattern, from the first sample values that make one."""
    values = samples(fleet)
    urls = []
    for path, parameters in every_pattern():
        missing = [parameter for parameter in parameters if parameter not in values]
        assert not missing, f"/{path} takes {missing}: add a sample value to samples()"
        for choice in itertools.product(*(values[parameter] for parameter in parameters)):
            url = "/" + path % dict(zip(parameters, choice, strict=True))
            try:
                resolve(url)
            except Resolver404:
                continue
            urls.append(url)
            break
        else:
            raise AssertionError(f"no sample value makes /{path} resolve: add one to samples()")
    return sorted(set(urls))


def strict_client(user) -> Client:
    """A browser session that, like a real one, sends no token unless the page gave it."""
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    return client


def csrf_token(client: Client) -> str:
    client.get("/accounts/login/")
    return client.cookies["csrftoken"].value


def test_the_walk_reaches_the_actions_sign_in_api_and_admin(fleet):
    urls = every_url(fleet)
    for url in (
        "/nodes/node01/drain/",
        "/nodes/node01/undrain/",
        f"/replicas/{fleet['stale'].id}/restart/",
        f"/profiles/{fleet['profile'].id}/scale/",
        f"/profiles/{fleet['profile'].id}/edit/",
        f"/catalog/models/{fleet['profile'].model_id}/delete/",
        "/deploy/",
        "/playground/key/",
        "/teams/gemma/keys/",
        "/teams/gemma/keys/llmgw-00000000/revoke/",
        "/accounts/login/",
        "/accounts/logout/",
        "/api/v1/keys/",
        "/api/v1/keys/1/revoke/",
        "/api/v1/profiles/1/",
        "/admin/login/",
        "/admin/fleet/node/node01/change/",
    ):
        assert url in urls


def test_every_url_refuses_an_unsafe_request_without_the_csrf_token(fleet, operator):
    client = strict_client(operator)
    accepted = []
    for url in every_url(fleet):
        for method in UNSAFE_METHODS:
            response = getattr(client, method)(url)
            # Django's middleware says "CSRF verification failed", DRF's session
            # authentication "CSRF Failed: CSRF cookie not set."
            if response.status_code != 403 or b"CSRF" not in response.content:
                accepted.append(f"{method.upper()} {url}: {response.status_code}")
    assert not accepted, "taken without a CSRF token:\n" + "\n".join(accepted)
    node = Node.objects.get(id="node01")
    assert not node.draining
    assert "_auth_user_id" in client.session, "signed out without a token"


def test_the_same_requests_with_the_token_go_through(fleet, operator):
    client = strict_client(operator)
    token = csrf_token(client)
    response = client.post("/nodes/node01/drain/", headers={"X-CSRFToken": token})
    assert response.status_code == 302
    assert Node.objects.get(id="node01").draining
    response = client.post(
        "/api/v1/keys/",
        {"name": "bench", "models": []},
        content_type="application/json",
        headers={"X-CSRFToken": token},
    )
    assert response.status_code == 201, response.content
    assert ApiKey.objects.filter(name="bench").exists()


def test_the_api_with_a_session_refuses_writes_without_the_token(operator):
    client = strict_client(operator)
    response = client.post("/api/v1/keys/", {"name": "bench"}, content_type="application/json")
    assert response.status_code == 403
    assert response.json()["detail"].startswith("CSRF Failed")
    assert not ApiKey.objects.filter(name="bench").exists()


@pytest.mark.parametrize(
    ("action", "subject", "reason"),
    [
        ("/nodes/node01/drain/", "node01", "drained"),
        ("/nodes/node01/undrain/", "node01", "returned to service"),
        ("/replicas/{stale}/restart/", "{stale}", "restart requested"),
        ("/profiles/{profile}/scale/", "gemma/cpu", "scaled from 2 to 3 replicas"),
        ("/catalog/models/{model}/delete/", "model/gemma", "deleted model gemma"),
    ],
    ids=["drain", "undrain", "restart", "scale", "delete"],
)
def test_each_operator_action_records_an_event_with_who_acted(
    fleet, operator, action, subject, reason
):
    Node.objects.filter(id="node01").update(draining=action.endswith("undrain/"))
    ids = {"stale": fleet["stale"].id, "profile": fleet["profile"].id,
           "model": fleet["profile"].model_id}  # fmt: skip
    client = strict_client(operator)
    token = csrf_token(client)
    before = set(Event.objects.values_list("id", flat=True))

    response = client.post(action.format(**ids), {"replicas": "3"}, headers={"X-CSRFToken": token})

    assert response.status_code == 302
    (event,) = Event.objects.exclude(id__in=before).filter(subject=subject.format(**ids))
    assert event.actor == operator and event.actor_name == "olga"
    assert event.reason.startswith(reason)
