"""The admin shows the fleet and changes it only through verbs: a drain or a pool change
made there is an Event naming the user, and a drain reaches the agent."""

from __future__ import annotations

import pytest

from audit.models import Event
from catalog.models import Pool
from fleet.models import Node
from protocol.commands import DRAIN
from tests.factories import make_node, make_replica, make_shard, make_user
from tests.fleet.queues import queued_commands

pytestmark = pytest.mark.django_db

NODES = "/admin/fleet/node/"


@pytest.fixture
def staff_client(client, admin_user):
    admin_user.is_staff = True
    admin_user.save()
    client.force_login(admin_user)
    return client


def act(client, action: str, *node_ids: str, **extra: str):
    return client.post(NODES, {"action": action, "_selected_action": node_ids, **extra})


def test_a_drain_from_the_admin_names_the_user_and_tells_the_agent(
    staff_client, admin_user, node_ids, django_capture_on_commit_callbacks
):
    make_node(node_ids[0])

    with django_capture_on_commit_callbacks(execute=True):
        response = act(staff_client, "drain", node_ids[0])

    assert response.status_code == 302
    assert Node.objects.get(id=node_ids[0]).draining
    event = Event.objects.get(subject=node_ids[0], reason="drained")
    assert (event.actor, event.description) == (admin_user, "drained by admin")
    assert (DRAIN, [True]) in queued_commands(node_ids[0], orders=True)

    with django_capture_on_commit_callbacks(execute=True):
        act(staff_client, "undrain", node_ids[0])
    assert not Node.objects.get(id=node_ids[0]).draining
    assert Event.objects.get(subject=node_ids[0], reason="returned to service").actor == admin_user
    assert queued_commands(node_ids[0], orders=True)[-1] == (DRAIN, [False])


def test_the_admin_puts_a_node_in_a_catalog_pool_and_takes_it_out(staff_client, admin_user):
    Pool.objects.create(name="a100")
    make_node("node01")

    act(staff_client, "put_in_pool", "node01", pool="a100")
    assert Node.objects.get(id="node01").pool == "a100"
    act(staff_client, "put_in_pool", "node01", pool="")
    assert Node.objects.get(id="node01").pool == ""

    events = Event.objects.filter(subject="node01").order_by("id")
    assert [(e.reason, e.actor) for e in events] == [
        ("put in pool a100 (was in no pool)", admin_user),
        ("taken out of every pool (was in pool a100)", admin_user),
    ]


def test_fleet_rows_are_read_only_in_the_admin(staff_client):
    node = make_node("node01")
    shard = make_shard(make_replica(state="ready"), node=node, state="ready")

    page = staff_client.get(f"{NODES}node01/change/")
    assert page.status_code == 200 and b'name="_save"' not in page.content
    assert staff_client.post(f"{NODES}node01/change/", {"draining": "on"}).status_code == 403
    assert not Node.objects.get(id="node01").draining
    assert staff_client.get(f"{NODES}add/").status_code == 403
    assert staff_client.post(f"{NODES}node01/delete/", {"post": "yes"}).status_code == 403
    assert staff_client.post(f"/admin/fleet/shard/{shard.id}/delete/").status_code == 403
    assert staff_client.get(f"/admin/fleet/replica/{shard.replica_id}/change/").status_code == 200


def test_staff_without_the_operator_role_get_no_fleet_actions(client):
    reader = make_user("rita")
    reader.is_staff = True
    reader.save()
    reader.user_permissions.add(*_view_permissions())
    client.force_login(reader)
    make_node("node01")

    assert b'value="drain"' not in client.get(NODES).content
    act(client, "drain", "node01")
    assert not Node.objects.get(id="node01").draining


def _view_permissions():
    from django.contrib.auth.models import Permission

    return Permission.objects.filter(codename="view_node")
