"""Revocation bites on the live link: ``ca revoke`` closes a node's link at once, in every
mode, its token stops linking, and the key its commands are signed with is its
certificate's, so a revoked certificate's key verifies nothing a later one is sent. Each
"linked" answer proves who sent it."""

from __future__ import annotations

import json

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator

from agent_worker.control_plane_proof import LinkedAnswerRefused, check_linked_answer
from agent_worker.identity import NodeIdentity
from audit.redis import redis_client
from core.redis_clients import channel_on
from fleet.actions.certificates import issue_node_certificate, revoke_node_certificates
from fleet.link.heartbeats import batcher
from fleet.models import Node
from fleet.pki.authority import init_ca
from fleet.pki.keys import command_key
from fleet.pki.revocation import REVOKED_CHANNEL
from fleet.pki.tokens import node_token
from protocol import messages
from tests.factories import SETUP
from tests.fleet.link_sockets import application, communicator, consumer_ended, register

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

NONCE = "an-agent-nonce"


@pytest.fixture
def ca(settings, tmp_path):
    settings.LLMGW_CA_DIR = str(tmp_path / "ca")
    init_ca()
    return tmp_path / "ca"


async def certificate_link(node_id: str, directory) -> tuple[WebsocketCommunicator, dict, int]:
    """A node linked by a fresh certificate: the socket, the "linked" answer, the serial."""
    issued = await database_sync_to_async(issue_node_certificate)(node_id, actor=SETUP)
    cert, key = directory / f"{node_id}-{issued.serial}.pem", directory / f"{node_id}-key.pem"
    cert.write_bytes(issued.cert_pem)
    key.unlink(missing_ok=True)
    key.write_bytes(issued.key_pem)
    headers = [(b"x-llmgw-node", node_id.encode()), (b"x-llmgw-auth", b"certificate"),
               (b"x-llmgw-link-nonce", NONCE.encode())]  # fmt: skip
    ws = WebsocketCommunicator(application(), "/agent/", headers=headers)
    assert (await ws.connect())[0]
    challenge = json.loads(await ws.receive_from())
    proof = NodeIdentity(str(cert), str(key)).proof(challenge["nonce"], node_id)
    await ws.send_to(text_data=json.dumps(proof))
    await ws.send_to(text_data=register(node_id))
    answer = json.loads(await ws.receive_from())
    assert answer["type"] == "linked", answer
    return ws, answer, issued.serial


async def token_link(node_id: str) -> tuple[WebsocketCommunicator, dict]:
    ws = communicator(node_id)
    ws.scope["headers"].append((b"x-llmgw-link-nonce", NONCE.encode()))
    assert (await ws.connect())[0]
    await ws.send_to(text_data=register(node_id))
    answer = json.loads(await ws.receive_from())
    assert answer["type"] == "linked", answer
    return ws, answer


async def closed_for_revocation(ws: WebsocketCommunicator) -> str:
    """The refusal a revoked link is told, once its close has followed (within 5 s)."""
    refusal = json.loads(await ws.receive_from(timeout=5))
    assert (await ws.receive_output(timeout=5))["type"] == "websocket.close"
    assert refusal["code"] == messages.CLOSE_UNAUTHENTICATED
    return refusal["reason"]


async def test_revoking_a_node_closes_its_certificate_link_within_seconds(settings, ca, tmp_path):
    settings.LLMGW_NODE_AUTH = "certificate"
    ws, _answer, serial = await certificate_link("node01", tmp_path)

    await database_sync_to_async(revoke_node_certificates)("node01", actor=SETUP)

    reason = await closed_for_revocation(ws)
    assert f"the certificate of node node01 (serial {serial}) was revoked" in reason
    # Anything it still sends is refused: not a heartbeat more is taken from it.
    batcher._latest.pop("node01", None)
    await ws.send_to(text_data=json.dumps({"type": "heartbeat", "usage": {"cpu_percent": 1}}))
    await ws.receive_nothing(timeout=0.2)
    assert "node01" not in batcher._latest


async def test_revoking_a_node_closes_its_token_link_and_its_token_links_no_more(ca, tmp_path):
    # Token mode (the tests' default): the node once had a certificate, now revoked.
    await database_sync_to_async(issue_node_certificate)("node01", actor=SETUP)
    ws, _answer = await token_link("node01")

    await database_sync_to_async(revoke_node_certificates)("node01", actor=SETUP)

    assert "node node01 was revoked" in await closed_for_revocation(ws)
    again = communicator("node01")
    await again.connect()
    refusal = json.loads(await again.receive_from())
    assert refusal["code"] == messages.CLOSE_UNAUTHENTICATED
    assert "node node01 was revoked" in refusal["reason"]
    assert "llmgw_ctl onboard node01" in refusal["reason"]
    assert await consumer_ended(again)


async def test_a_revocation_notice_without_a_revocation_closes_nothing(ca, tmp_path):
    # Anything that can publish on Redis could send one: the database says who is revoked.
    ws, _answer = await token_link("node01")
    client = redis_client()
    await database_sync_to_async(client.publish)(channel_on(client, REVOKED_CHANNEL), "node01")
    await ws.receive_nothing(timeout=1.0)
    still = Node.objects.filter(id="node01", state="connected")
    assert await database_sync_to_async(still.exists)()
    await ws.disconnect()


async def test_the_command_key_is_the_certificates_and_changes_with_it(settings, ca, tmp_path):
    settings.LLMGW_NODE_AUTH = "certificate"
    first, answer, serial = await certificate_link("node01", tmp_path)
    await first.disconnect()
    assert answer["command_key"] == command_key("node01", str(serial))
    node = await database_sync_to_async(Node.objects.get)(id="node01")
    assert node.key_generation == str(serial)

    # Revoked and onboarded again: the new certificate brings a new key.
    await database_sync_to_async(revoke_node_certificates)("node01", actor=SETUP)
    second, renewed, new_serial = await certificate_link("node01", tmp_path)
    await second.disconnect()
    assert renewed["command_key"] == command_key("node01", str(new_serial))
    assert renewed["command_key"] != answer["command_key"]
    assert answer["command_key"] != node_token("node01")


async def test_the_linked_answer_proves_the_control_plane_to_the_agent(settings, ca, tmp_path):
    settings.LLMGW_NODE_AUTH = "certificate"
    ws, answer, _serial = await certificate_link("node01", tmp_path)
    await ws.disconnect()
    ca_pem = (ca / "ca.pem").read_bytes()
    assert check_linked_answer(answer, NONCE, "node01", ca_pem=ca_pem) == answer["command_key"]
    with pytest.raises(LinkedAnswerRefused, match="signature does not match"):
        check_linked_answer(answer, "another link's nonce", "node01", ca_pem=ca_pem)
    forged = {**answer, "command_key": "the attacker's"}
    with pytest.raises(LinkedAnswerRefused, match="signature does not match"):
        check_linked_answer(forged, NONCE, "node01", ca_pem=ca_pem)

    settings.LLMGW_NODE_AUTH = "token"
    token_ws, token_answer = await token_link("node02")
    await token_ws.disconnect()
    token = node_token("node02")
    assert check_linked_answer(token_answer, NONCE, "node02", token=token) == command_key(
        "node02", "token"
    )
    with pytest.raises(LinkedAnswerRefused):
        check_linked_answer(token_answer, NONCE, "node02", token="node02.another")
