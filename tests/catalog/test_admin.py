"""The admin changes the catalog through the same verbs as the API and `llmgw_ctl`."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth.models import Group, Permission

from audit.filters import ACCOUNT_KINDS
from audit.models import Event
from catalog.models import Engine, Pool, Profile
from catalog.permissions import ENGINE_ADMINS_GROUP
from tests.factories import make_profile

pytestmark = pytest.mark.django_db


def test_an_admin_edit_is_an_event_naming_who_made_it(client, admin_user):
    admin_user.is_staff = True
    admin_user.save()
    client.force_login(admin_user)
    response = client.post("/admin/catalog/pool/add/", {"name": "a100", "description": ""})
    assert response.status_code == 302, response.content.decode()[:2000]
    pool = Pool.objects.get(name="a100")
    response = client.post(f"/admin/catalog/pool/{pool.id}/delete/", {"post": "yes"})
    assert response.status_code == 302
    assert not Pool.objects.exists()
    events = Event.objects.filter(subject="pool/a100").order_by("id")
    assert [(e.reason, e.actor) for e in events] == [
        ("created pool a100", admin_user),
        ("deleted pool a100", admin_user),
    ]


def staff(client, user, *permissions: str):
    """Sign ``user`` in to the admin as staff, with these Django model permissions."""
    user.is_staff = True
    user.save()
    user.user_permissions.add(*Permission.objects.filter(codename__in=permissions))
    client.force_login(user)
    return client


def profile_form(client, profile: Profile, **changes) -> dict:
    """The admin's change form for ``profile`` as the page fills it, with ``changes``."""
    page = client.get(f"/admin/catalog/profile/{profile.id}/change/")
    form = page.context["adminform"].form
    data = {name: form[name].value() for name in form.fields}
    data.update({k: v if isinstance(v, str) else json.dumps(v) for k, v in changes.items()})
    return {name: "" if value is None else value for name, value in data.items()}


def form_errors(response) -> dict:
    return response.context["adminform"].form.errors


def test_a_staff_user_outside_operators_cannot_change_a_profile_whatever_django_allows(
    client, reader
):
    profile = make_profile(replicas=1)
    staff(client, reader, "view_profile", "change_profile", "add_engine", "change_engine")
    data = profile_form(client, profile)
    data["replicas"] = "5"

    changed = client.post(f"/admin/catalog/profile/{profile.id}/change/", data)
    added = client.post("/admin/catalog/engine/add/", {"name": "llama.cpp", "version": "b1",
                                                       "builds": "[]"})  # fmt: skip

    assert (changed.status_code, added.status_code) == (403, 403)
    profile.refresh_from_db()
    assert profile.replicas == 1 and not Engine.objects.exists()


@pytest.mark.parametrize(
    ("changes", "said"),
    [
        ({"args": ["--host", "0.0.0.0"]}, "args sets --host, which llmgw chooses; remove it"),
        (
            {"env": {"LD_PRELOAD": "/w/evil.so"}},
            "env LD_PRELOAD=/w/evil.so is read by the dynamic loader",
        ),
        ({"engine": "tgi"}, "unknown engine 'tgi'"),
    ],
    ids=["owned-flag", "loader-variable", "unknown-engine"],
)
def test_an_operators_admin_save_is_checked_like_an_apply_and_saves_nothing(
    client, operator, changes, said
):
    profile = make_profile(replicas=1, args=["--threads", "2"])
    staff(client, operator)
    data = profile_form(client, profile, **changes)
    data["replicas"] = "3"

    response = client.post(f"/admin/catalog/profile/{profile.id}/change/", data)

    assert response.status_code == 200  # the form again, with its errors
    errors = " ".join(said for field in form_errors(response).values() for said in field)
    assert said in errors, errors
    profile.refresh_from_db()
    assert (profile.replicas, profile.args, profile.env) == (1, ["--threads", "2"], {})
    assert not Event.objects.exclude(kind__in=ACCOUNT_KINDS).exists()  # the scene aside


def test_an_operators_admin_save_goes_through_the_verb(client, operator):
    profile = make_profile(replicas=1)
    staff(client, operator)
    data = profile_form(client, profile)
    data["replicas"] = "3"

    response = client.post(f"/admin/catalog/profile/{profile.id}/change/", data)

    assert response.status_code == 302, form_errors(response)
    profile.refresh_from_db()
    assert profile.replicas == 3
    assert Event.objects.exclude(kind__in=ACCOUNT_KINDS).get().actor == operator


def test_only_an_engine_admin_adds_an_engine_build_through_the_admin(client, operator):
    build = {"name": "cpu-x64", "url": "https://e.org/b.tar.gz", "sha256": "a" * 64}
    row = {"name": "llama.cpp", "version": "b6000", "builds": json.dumps([build])}
    staff(client, operator)

    refused = client.post("/admin/catalog/engine/add/", row)
    operator.groups.add(Group.objects.get_or_create(name=ENGINE_ADMINS_GROUP)[0])
    added = client.post("/admin/catalog/engine/add/", row)

    assert refused.status_code == 200
    assert "needs the engine-admin group" in str(form_errors(refused))
    assert added.status_code == 302
    assert Engine.objects.get().builds[0]["packages"] == []  # in the file's one spelling


def test_an_engine_version_that_climbs_out_is_refused_in_the_admin_too(client, admin_user):
    staff(client, admin_user)

    response = client.post(
        "/admin/catalog/engine/add/", {"name": "llama.cpp", "version": "b1/../x", "builds": "[]"}
    )

    assert response.status_code == 200
    assert "is not usable as a directory name" in str(form_errors(response))
    assert not Engine.objects.exists()
