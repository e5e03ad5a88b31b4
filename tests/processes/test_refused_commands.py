"""Commands a real agent must not obey: put straight on its queue in the real broker,
unsigned, altered, signed for another node or expired; each is dropped, logged, and
recorded as an Event on the node."""

from __future__ import annotations

import time
import uuid

import pytest
from celery import current_app

from audit.models import Event
from fleet.commands import node_queue
from fleet.models import Node
from fleet.pki.tokens import node_token
from protocol.commands import ENGINE_CHECK
from protocol.signing import sign
from tests.processes.support import agent, control_plane, free_port, listening, wait_until

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]


def test_commands_not_signed_for_the_node_are_dropped_and_reported(processes, tmp_path):
    node_id = f"rc-{uuid.uuid4().hex[:6]}"
    port = free_port()
    processes.append(control_plane(port, tmp_path).start())
    wait_until(lambda: listening(port), 60, "the control plane")
    worker = agent(node_id, f"ws://127.0.0.1:{port}", node_token(node_id), tmp_path, tmp_path)
    processes.append(worker.start())
    wait_until(lambda: Node.objects.filter(id=node_id, state="connected").exists(), 60,
             "the agent to register")  # fmt: skip
    deadline = time.time() + 60
    signed = sign(node_token(node_id), ENGINE_CHECK, ["llama.cpp"], deadline)
    cases = {
        "arrived unsigned": ({"deadline": deadline, "signature": ""}, ["llama.cpp"]),
        # Signed for llama.cpp, and altered on the way to ask for something else.
        "was not signed for this node": ({"deadline": deadline, "signature": signed}, ["vllm"]),
        "not signed for this node (foreign)": (
            {"deadline": deadline,
             "signature": sign(node_token("other"), ENGINE_CHECK, ["llama.cpp"], deadline)},
            ["llama.cpp"],
        ),
        "arrived after its deadline": (
            {"deadline": time.time() - 1,
             "signature": sign(node_token(node_id), ENGINE_CHECK, ["llama.cpp"],
                               time.time() - 1)},
            ["llama.cpp"],
        ),
    }  # fmt: skip
    for kwargs, args in cases.values():
        current_app.send_task(ENGINE_CHECK, args=args, kwargs=kwargs, queue=node_queue(node_id))

    refused = wait_until(
        lambda: (found := list(Event.objects.filter(
            subject=node_id, reason__startswith="agent refused a command"
        ).values_list("reason", flat=True))) and len(found) >= 4 and found,
        60, "the agent to report the commands it refused",
    )  # fmt: skip
    assert sum("arrived unsigned" in reason for reason in refused) == 1
    assert sum("was not signed for this node" in reason for reason in refused) == 2
    assert sum("arrived after its deadline" in reason for reason in refused) == 1
    assert "engine check of" not in worker.output()  # none of them ran
    assert worker.output().count("refusing a command agent.engine_check") == 4
