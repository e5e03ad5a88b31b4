"""The admin changes the catalog through the same verbs as the API and `llmgw_ctl`."""

from __future__ import annotations

import pytest

from audit.models import Event
from catalog.models import Pool

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
