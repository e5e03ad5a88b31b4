"""The Event that answers "why is it placed there now?": a node that gains RAM, GPUs or an
engine says so once, whether a register, an engines message or a heartbeat told it."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from audit.actors import AGENT_LINK
from audit.models import Event
from fleet.actions.reports import register_node, update_engines
from fleet.link.heartbeats import write_heartbeats
from fleet.models import Node
from protocol import messages
from protocol.engines import EngineInstall
from protocol.inventory import NodeUsage
from tests.fleet.inventories import inventory

pytestmark = pytest.mark.django_db

NOW = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
GiB = 1 << 30


def register(node_id: str = "node01", gpus: int = 0, memory: int = 64 * GiB, engines=()) -> None:
    message = messages.Register(
        inventory=inventory(node_id, gpus=gpus, memory_total=memory),
        engines_probed=True,
        engines=[EngineInstall(engine=name, version="b6000") for name in engines],
    )
    register_node(node_id, message, actor=AGENT_LINK)


def heartbeat(node_id: str, memory_total: int) -> None:
    usage = NodeUsage(
        cpu_percent=5.0, load=(0.1, 0.1, 0.1), memory_total=memory_total,
        memory_used=4 * GiB, memory_available=memory_total - 4 * GiB,
    )  # fmt: skip
    write_heartbeats({node_id: (NOW, usage.model_dump(mode="json"))})


def qualified(node_id: str = "node01") -> list[str]:
    return list(
        Event.objects.filter(kind="node", subject=node_id, reason__contains="now qualifies")
        .order_by("id")
        .values_list("reason", flat=True)
    )


def test_a_register_with_more_ram_gpus_and_an_engine_says_what_was_gained():
    register(memory=64 * GiB)
    register(memory=128 * GiB, gpus=2, engines=["llama.cpp"])

    assert qualified() == [
        "node node01 now qualifies for more: RAM grew to 128 GiB; 2 GPUs; engine llama.cpp"
    ]


def test_a_register_that_gains_nothing_records_nothing():
    register(engines=["llama.cpp"])
    register(engines=["llama.cpp"])

    assert qualified() == []


def test_an_engines_message_with_a_new_engine_says_so():
    register()

    update_engines(
        "node01", messages.Engines(engines=[EngineInstall(engine="vllm")]), actor=AGENT_LINK
    )

    assert qualified() == ["node node01 now qualifies for more: engine vllm"]


def test_a_heartbeat_that_sees_the_vm_grow_says_so_once():
    # memory_total is re-read on every heartbeat so that a resized VM is noticed; noticing
    # it is what makes the node a candidate for a model it could not hold before.
    register(memory=64 * GiB)
    heartbeat("node01", 64 * GiB)
    assert qualified() == []

    heartbeat("node01", 96 * GiB)
    heartbeat("node01", 96 * GiB)
    said = qualified()
    register(memory=96 * GiB)  # the agent restarts: its register says what was already said

    assert said == ["node node01 now qualifies for more: RAM grew to 96 GiB"]
    assert qualified() == said


def test_a_heartbeat_with_less_ram_records_nothing():
    register(memory=64 * GiB)

    heartbeat("node01", 32 * GiB)

    assert qualified() == []


def test_an_agent_restart_before_its_engines_are_probed_changes_nothing():
    # The register goes out before the agent has looked at the engines its file names
    # (SGLang's import takes seconds); the probe's list follows. Neither is a change: no
    # "now qualifies" Event, and the crash-loop backoffs on the node keep counting.
    register(engines=["sglang"])
    changed_at = Node.objects.get(id="node01").engines_changed_at
    assert changed_at is not None

    register_node(
        "node01",
        messages.Register(inventory=inventory("node01"), engines_probed=False, engines=[]),
        actor=AGENT_LINK,
    )
    node = Node.objects.get(id="node01")
    assert node.installed_engines() == {"sglang": {"b6000"}}
    update_engines(
        "node01",
        messages.Engines(engines=[EngineInstall(engine="sglang", version="b6000")]),
        actor=AGENT_LINK,
    )

    assert qualified() == []
    assert Node.objects.get(id="node01").engines_changed_at == changed_at
