"""A real agent worker on the real broker as its node's own Redis user (issue 39 part 1):
it takes its commands, answers request/reply ones through the result backend and puts back
what it held when it stops, and Redis refuses it nothing meanwhile (``ACL LOG``)."""

from __future__ import annotations

import uuid

import pytest
from django.conf import settings

from audit.redis import redis_client
from core.redis_urls import with_credentials
from fleet import commands
from fleet.models import Node
from fleet.pki import broker_users
from fleet.pki.tokens import node_token
from tests.processes.support import agent, control_plane, free_port, listening, wait_until

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]


def refusals(user: str) -> list[dict]:
    """What Redis refused ``user`` (the ACL log is the server's: other users' are left out)."""
    entries = redis_client().execute_command("ACL", "LOG", "128")
    found = []
    for entry in entries:
        fields = (
            dict(zip(entry[::2], entry[1::2], strict=True)) if isinstance(entry, list) else entry
        )
        fields = {(k.decode() if isinstance(k, bytes) else k): v for k, v in fields.items()}
        name = fields.get("username")
        if (name.decode() if isinstance(name, bytes) else name) != user:
            continue
        if fields.get("object") == b"client" and not broker_users.knows_setinfo(redis_client()):
            continue  # redis-py's CLIENT SETINFO, which a server before 7.2 does not know
        found.append(fields)
    return found


def test_an_agent_is_served_as_its_nodes_own_broker_user(processes, tmp_path):
    node_id = f"br-{uuid.uuid4().hex[:6]}"
    password, sha256 = broker_users.new_password()
    client = redis_client()
    broker_users.set_user(client, node_id, sha256)
    user = broker_users.user_name(node_id, broker_users.database_of(client))
    port = free_port()
    try:
        processes.append(control_plane(port, tmp_path).start())
        wait_until(lambda: listening(port), 60, "the control plane")
        own = with_credentials(settings.REDIS_URL, user, password)
        worker = agent(node_id, f"ws://127.0.0.1:{port}", node_token(node_id), tmp_path, tmp_path,
                       LLMGW_AGENT_BROKER=own)  # fmt: skip
        processes.append(worker.start())
        wait_until(lambda: Node.objects.filter(id=node_id, state="connected").exists(), 60,
                   "the agent to register")  # fmt: skip

        for _ in range(3):  # request/reply: its result stored and announced on its own keys
            answer = commands.read_logs(node_id, "agent", 5)
            assert "agent" in answer["sources"], answer
        commands.send_drain(node_id, False)  # fire and forget, its result stored all the same
        worker.stop()
        assert refusals(user) == []
        assert worker.output().count("NOPERM") == 0
    finally:
        broker_users.delete_user(client, node_id)
