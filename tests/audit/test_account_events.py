"""Sign-ins, failed sign-ins and changes of an account's roles are Events, whichever way
they came (``audit.receivers``), naming who acted."""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync
from django.contrib.auth import authenticate
from django.contrib.auth.models import Group, User
from django.test import AsyncClient, Client, RequestFactory

from audit.actors import SystemActor, acting_as
from audit.models import Event, EventKind
from catalog.permissions import ENGINE_ADMINS_GROUP, OPERATORS_GROUP
from tests.factories import make_user

pytestmark = pytest.mark.django_db

IDENTITY_PROVIDER = SystemActor("identity provider")


@pytest.fixture
def at_the_shell(monkeypatch):
    monkeypatch.delenv("SUDO_USER", raising=False)
    monkeypatch.setattr("audit.actors.getpass.getuser", lambda: "sam")


def account_events(username: str, kind: str) -> list[tuple[str, str]]:
    rows = Event.objects.filter(kind=kind, subject=username).order_by("id")
    return [(row.reason, row.actor_name) for row in rows]


def test_a_sign_in_and_a_refused_one_are_recorded_with_where_from():
    olga = make_user("olga")
    client = Client()

    client.post("/accounts/login/", {"username": "olga", "password": "nope"},
                REMOTE_ADDR="10.0.0.7")  # fmt: skip
    client.post("/accounts/login/", {"username": "olga", "password": "pw-olga"},
                REMOTE_ADDR="10.0.0.7")  # fmt: skip

    refused, signed_in = Event.objects.filter(kind=EventKind.SIGN_IN).order_by("id")
    assert (refused.subject, refused.reason, refused.to_state) == (
        "olga", "sign-in refused from 10.0.0.7", "refused"
    )  # fmt: skip
    assert refused.actor is None and refused.actor_name == ""  # whoever typed it is no one known
    assert (signed_in.subject, signed_in.reason, signed_in.to_state) == (
        "olga", "signed in from 10.0.0.7", "signed-in"
    )  # fmt: skip
    assert signed_in.actor == olga


def test_a_refused_sign_in_as_no_account_is_recorded_as_typed():
    Client().post("/admin/login/", {"username": "root", "password": "toor"}, REMOTE_ADDR="10.0.0.8")
    assert account_events("root", EventKind.SIGN_IN) == [("sign-in refused from 10.0.0.8", "")]


def test_groups_changed_in_the_admin_name_the_admin(admin_user):
    olga = make_user("olga")
    operators = Group.objects.get_or_create(name=OPERATORS_GROUP)[0]
    admin_user.is_staff = True
    admin_user.save()
    client = Client()
    client.force_login(admin_user)

    response = client.post(f"/admin/auth/user/{olga.id}/change/", {
        "username": "olga", "is_active": "on", "groups": [operators.id],
        "date_joined_0": "2026-12-06", "date_joined_1": "10:00:00",
    })  # fmt: skip

    assert response.status_code == 302, response.context["adminform"].form.errors
    assert account_events("olga", EventKind.ROLE) == [("added to operators", "admin")]
    assert Event.objects.get(kind=EventKind.ROLE, subject="olga").actor == admin_user


@pytest.mark.django_db(transaction=True)
def test_a_request_served_over_asgi_names_its_user_too(admin_user):
    """Under daphne the middleware runs as a coroutine and the view in a thread: the
    request's user still reaches the receiver."""
    olga = make_user("olga")
    engine_admins = Group.objects.get(name=ENGINE_ADMINS_GROUP)
    admin_user.is_staff = True
    admin_user.save()
    client = AsyncClient()

    async def change() -> int:
        await client.aforce_login(admin_user)
        response = await client.post(f"/admin/auth/user/{olga.id}/change/", {
            "username": "olga", "is_active": "on", "groups": [engine_admins.id],
            "date_joined_0": "2026-12-06", "date_joined_1": "10:00:00",
        })  # fmt: skip
        return response.status_code

    assert async_to_sync(change)() == 302
    assert account_events("olga", EventKind.ROLE) == [("added to engine-admin", "admin")]


def test_every_way_of_changing_groups_is_recorded(at_the_shell):
    olga = make_user("olga")
    operators = Group.objects.get(name=OPERATORS_GROUP)  # made by a migration
    engine_admins = Group.objects.get(name=ENGINE_ADMINS_GROUP)

    olga.groups.add(operators, engine_admins)  # at the shell: its user acted
    with acting_as(IDENTITY_PROVIDER):  # a sign-in mapping a claim says who it is
        engine_admins.user_set.remove(olga)
    olga.groups.clear()
    olga.groups.add(operators)
    olga.groups.add(operators)  # already in it: nothing happened, nothing said

    assert account_events("olga", EventKind.ROLE) == [
        ("added to engine-admin; added to operators", "sam"),
        ("removed from engine-admin", ""),
        ("removed from operators", "sam"),
        ("added to operators", "sam"),
    ]


def test_the_superuser_flag_is_a_role_and_a_sign_in_save_is_not(at_the_shell):
    make_user("root", superuser=True)
    olga = make_user("olga")
    olga.is_superuser = True
    olga.save()
    olga.save()  # saved again, unchanged
    olga.is_superuser = False
    olga.save(update_fields=["is_superuser"])
    User.objects.get(username="olga").save(update_fields=["last_login"])

    assert account_events("root", EventKind.ROLE) == [("made a superuser (every role)", "sam")]
    assert account_events("olga", EventKind.ROLE) == [
        ("made a superuser (every role)", "sam"),
        ("no longer a superuser", "sam"),
    ]


def test_a_backend_that_records_its_own_sign_ins_is_not_recorded_twice():
    """The identity provider's sign-in records its own (naming the provider, with its
    reasons for a refusal): the receivers leave its sign-ins and callbacks be."""
    lena = make_user("lena")
    Client().force_login(lena, backend="fleet.oidc.backend.ProviderBackend")
    Client().force_login(lena, backend="django.contrib.auth.backends.ModelBackend")
    authenticate(RequestFactory().get("/accounts/oidc/callback/"), nonce="n", code_verifier="v")

    assert account_events("lena", EventKind.SIGN_IN) == [("signed in from unknown", "lena")]
    assert not Event.objects.filter(to_state="refused").exists()
