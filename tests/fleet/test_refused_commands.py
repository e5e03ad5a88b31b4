"""What a node says it refused becomes one Event on the node, a flood included."""

from __future__ import annotations

import pytest

from audit.actors import AGENT_LINK
from audit.models import Event
from fleet.actions.reports import record_refused_command
from protocol.messages import CommandRefused
from tests.factories import make_node

pytestmark = pytest.mark.django_db


def test_one_refused_command_is_an_event_naming_it():
    make_node("node01")
    refused = CommandRefused(task="agent.start_shard", reason="agent.start_shard arrived unsigned")

    record_refused_command("node01", refused, actor=AGENT_LINK)

    assert Event.objects.get(subject="node01").reason == (
        "agent refused a command agent.start_shard: agent.start_shard arrived unsigned"
    )


def test_a_flood_of_refused_commands_is_one_event_saying_how_many():
    make_node("node01")
    counted = CommandRefused(
        task="agent.start_shard", reason="agent.start_shard was not signed for this node",
        count=999,
    )  # fmt: skip

    record_refused_command("node01", counted, actor=AGENT_LINK)

    assert Event.objects.get(subject="node01").reason == (
        "agent refused 999 commands in the last minute; the last, agent.start_shard: "
        "agent.start_shard was not signed for this node"
    )
