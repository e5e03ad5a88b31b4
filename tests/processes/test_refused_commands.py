"""Commands a real agent must not obey: put straight on its queue in the real broker,
unsigned, altered, signed for another node, expired or put back a second time; each is
dropped and logged, and told to the control plane as an Event on the node, counted."""

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
from tests.fleet.queues import node_command_key
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
    # Connected is the control plane's side; the agent checks commands once its link's
    # answer gave it the key (a command before that waits, then is dropped, not refused).
    wait_until(lambda: "linked to control plane" in worker.output(), 60,
               "the agent to take its command key")  # fmt: skip
    deadline = time.time() + 60
    token = node_command_key(node_id)  # what its link told it

    def envelope(signature: str, at: float = deadline, command_id: str = "") -> dict:
        command_id = command_id or uuid.uuid4().hex
        return {"deadline": at, "signature": signature, "command_id": command_id}

    def signed(args: list, key: str = token, at: float = deadline, command_id: str = "") -> dict:
        command_id = command_id or uuid.uuid4().hex
        return envelope(sign(key, ENGINE_CHECK, args, at, command_id), at, command_id)

    altered = signed(["llama.cpp"])  # signed for llama.cpp, altered to ask for vllm
    cases = [
        (envelope(""), ["llama.cpp"]),
        (altered, ["vllm"]),
        (signed(["llama.cpp"], key=node_token(node_id)), ["llama.cpp"]),  # its token: no key
        (signed(["llama.cpp"], at=time.time() - 1), ["llama.cpp"]),
    ]
    replayed = signed(["llama.cpp"])
    cases += [(replayed, ["llama.cpp"]), (replayed, ["llama.cpp"])]  # obeyed once
    for kwargs, args in cases:
        current_app.send_task(ENGINE_CHECK, args=args, kwargs=kwargs, queue=node_queue(node_id))

    wait_until(lambda: worker.output().count("refusing a command agent.engine_check") >= 5, 60,
               "the agent to refuse the commands")  # fmt: skip
    output = worker.output()
    for reason in ("arrived unsigned", "arrived after its deadline", "was obeyed already"):
        assert output.count(reason) == 1, reason
    assert output.count("was not signed for this node") == 2
    assert output.count("engine check of") == 1  # the replayed command, once
    # The first (four threads: whichever that is) is told at once; the others are counted
    # and told once the minute is over, so a flood is an Event a minute, not an Event each.
    refused = wait_until(
        lambda: list(Event.objects.filter(
            subject=node_id, reason__startswith="agent refused"
        ).values_list("reason", flat=True)),
        60, "the agent to report the commands it refused",
    )  # fmt: skip
    assert len(refused) == 1 and refused[0].startswith("agent refused a command agent.engine_check")
