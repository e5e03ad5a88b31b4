"""A node linking with the engines it reports, and a reconcile pass run now: what the
engine tests of the control plane share."""

from __future__ import annotations

from audit.actors import AGENT_LINK
from fleet.actions.reports import register_node
from fleet.models import Node
from fleet.reconcile.passes import reconcile
from protocol import messages
from protocol.engines import EngineInstall
from tests.fleet.inventories import inventory


def link(node_id: str, *installs: EngineInstall, now=None) -> Node:
    register = messages.Register(
        inventory=inventory(node_id), engines_probed=True, engines=list(installs)
    )
    return register_node(node_id, register, now=now, actor=AGENT_LINK)


def reconcile_now(capture, now=None):
    with capture(execute=True):
        return reconcile(now=now)
