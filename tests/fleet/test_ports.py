"""Engine ports: allocated per host, so two engines on one machine never share one."""

from __future__ import annotations

import pytest
from django.conf import settings

from fleet.planning.shard_specs import allocate_port
from tests.factories import make_node, make_replica, make_shard

pytestmark = pytest.mark.django_db


def test_a_port_held_on_the_node_is_skipped_with_its_rendezvous_neighbour():
    node = make_node("node01", address="10.0.0.1")
    make_shard(node=node, port=settings.ENGINE_PORT_BASE, state="ready")

    assert allocate_port("node01") == settings.ENGINE_PORT_BASE + 2


def test_nodes_sharing_an_address_share_its_ports():
    # Two node ids on one host (agents side by side, or a node re-onboarded under a new
    # name while its old engine still runs): a port one holds is taken for the other.
    make_node("node01", address="10.0.0.1")
    make_node("node02", address="10.0.0.1")
    make_node("node03", address="10.0.0.3")
    replica = make_replica()
    make_shard(replica, 0, node_id="node01", port=settings.ENGINE_PORT_BASE, state="ready")
    make_shard(replica, 1, node_id="node01", port=settings.ENGINE_PORT_BASE + 4, state="stopped")

    assert allocate_port("node02") == settings.ENGINE_PORT_BASE + 2
    assert allocate_port("node03") == settings.ENGINE_PORT_BASE
