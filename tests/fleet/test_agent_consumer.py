"""The control plane's end of the link, through Channels' WebsocketCommunicator."""

from __future__ import annotations

import json

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator

from fleet.link.heartbeats import batcher
from fleet.models import Node
from fleet.pki.tokens import node_token
from protocol import messages
from tests.factories import SETUP
from tests.fleet.link_sockets import application, communicator, consumer_ended, linked, register

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


async def test_register_creates_the_node_connected():
    ws = await linked("node01")
    node = await database_sync_to_async(Node.objects.get)(id="node01")
    assert (node.state, node.address, node.engines) == ("connected", "10.0.0.1", [])
    await ws.disconnect()


async def test_a_link_without_a_token_is_refused_with_the_fix():
    ws = communicator("node01", token=False)
    await ws.connect()
    refusal = json.loads(await ws.receive_from())
    assert refusal["type"] == "refused"
    assert "llmgw_ctl node-token node01" in refusal["reason"]
    assert (await ws.receive_output())["type"] == "websocket.close"
    assert await consumer_ended(ws)
    assert not await database_sync_to_async(Node.objects.exists)()


async def test_a_register_for_another_host_is_refused():
    ws = communicator("node01")
    await ws.connect()
    await ws.send_to(text_data=register("node02"))
    refusal = json.loads(await ws.receive_from())
    assert refusal["reason"].startswith(
        "register describes host 'node02' on the link of node 'node01'"
    )
    # The consumer ends itself: its tasks must not outlive the refused link.
    assert await consumer_ended(ws)
    assert not await database_sync_to_async(Node.objects.exists)()


async def test_a_malformed_message_is_refused_and_the_row_is_untouched():
    ws = await linked("node01")
    before = await database_sync_to_async(Node.objects.get)(id="node01")
    await ws.send_to(text_data=json.dumps({"type": "heartbeat", "usage": {"cpu_percent": "lots"}}))
    error = json.loads(await ws.receive_from())
    assert error["type"] == "error"
    assert "usage.cpu_percent" in error["reason"]
    await ws.send_to(text_data="not json at all")
    assert json.loads(await ws.receive_from())["type"] == "error"
    after = await database_sync_to_async(Node.objects.get)(id="node01")
    assert (after.usage, after.inventory) == (before.usage, before.inventory)
    await ws.disconnect()


async def test_heartbeats_are_written_in_a_batch():
    ws = await linked("node01")
    usage = {"cpu_percent": 12.5, "load": [0.5, 0.4, 0.3], "memory_total": 8 << 30,
             "memory_used": 2 << 30, "memory_available": 6 << 30}  # fmt: skip
    await ws.send_to(text_data=json.dumps({"type": "heartbeat", "usage": usage}))
    await ws.send_to(
        text_data=json.dumps({"type": "heartbeat", "usage": {**usage, "cpu_percent": 50}})
    )
    # The batcher flushes on a timer; flush now rather than sleep through it.
    for _ in range(100):
        if batcher._latest:
            break
        await ws.receive_nothing(timeout=0.01)
    assert await batcher.flush() == 1
    node = await database_sync_to_async(Node.objects.get)(id="node01")
    assert node.usage["cpu_percent"] == 50
    assert node.usage_reported_at is not None
    await ws.disconnect()


async def test_a_fake_agent_reporting_shards_rebuilds_its_replicas():
    import uuid

    from catalog.actions.entries import apply_catalog
    from fleet.models import Replica
    from protocol.shard import ShardSpec

    await database_sync_to_async(apply_catalog)(
        "models:\n  - name: gemma\n    source: /m/gemma.gguf\n    profiles:\n"
        "      - name: cpu\n        engine: llama.cpp\n",
        actor=SETUP,
    )
    from catalog.models import Profile
    from fleet.pki.keys import replica_secret

    fingerprint = await database_sync_to_async(lambda: Profile.objects.get().fingerprint())()
    replica_id = str(uuid.uuid4())
    spec = ShardSpec(shard_id=uuid.uuid4().hex, replica_id=replica_id, model="gemma",
                     source="/m/gemma.gguf", engine="llama.cpp", profile="cpu", port=20000,
                     fingerprint=fingerprint, api_key=replica_secret(replica_id))  # fmt: skip
    ws = communicator("node01")
    await ws.connect()
    await ws.send_to(
        text_data=register("node01", shards=[messages.ReportedShard(spec=spec, state="ready")])
    )
    assert json.loads(await ws.receive_from())["type"] == "linked"
    replica = await database_sync_to_async(Replica.objects.get)()
    assert (str(replica.id), replica.state, replica.fingerprint) == (
        spec.replica_id, "ready", fingerprint,
    )  # fmt: skip
    await ws.disconnect()


async def test_a_standby_names_its_leader_only_to_an_authenticated_node(settings):
    from fleet import leadership

    settings.LEADER_LEASE_KEY = f"llmgw:test-lease:{id(settings)}"
    await database_sync_to_async(leadership.acquire_or_renew)("wss://the-leader:8443")
    try:
        stranger = communicator("node01", token="node01.forged")
        await stranger.connect()
        refusal = json.loads(await stranger.receive_from())
        assert refusal["code"] == messages.CLOSE_UNAUTHENTICATED
        assert "the-leader" not in refusal["reason"]
        assert await consumer_ended(stranger)

        node = communicator("node01")
        await node.connect()
        refusal = json.loads(await node.receive_from())
        assert refusal["code"] == messages.CLOSE_NOT_LEADER
        assert "the leader is wss://the-leader:8443" in refusal["reason"]
    finally:
        await database_sync_to_async(leadership.release)("wss://the-leader:8443")


async def test_a_control_plane_for_certificates_refuses_a_token_with_the_fix(settings):
    settings.LLMGW_NODE_AUTH = "certificate"
    ws = communicator("node01")
    await ws.connect()
    refusal = json.loads(await ws.receive_from())
    assert refusal["type"] == "refused"
    assert "links with a token" in refusal["reason"]
    assert "llmgw_ctl onboard node01" in refusal["reason"]
    assert "LLMGW_NODE_AUTH=token" in refusal["reason"]
    assert await consumer_ended(ws)


async def test_a_challenge_answered_with_nonsense_is_refused(settings):
    settings.LLMGW_NODE_AUTH = "certificate"
    headers = [(b"x-llmgw-node", b"node01"), (b"x-llmgw-auth", b"certificate")]
    ws = WebsocketCommunicator(application(), "/agent/", headers=headers)
    await ws.connect()
    challenge = json.loads(await ws.receive_from())
    assert challenge["type"] == "challenge" and len(challenge["nonce"]) == 32
    await ws.send_to(text_data=register("node01"))  # a register where the proof belongs
    refusal = json.loads(await ws.receive_from())
    assert refusal["type"] == "refused"
    assert "did not answer the challenge with a proof" in refusal["reason"]
    assert await consumer_ended(ws)
    assert not await database_sync_to_async(Node.objects.exists)()


async def test_the_link_tells_a_registering_node_the_epoch_that_leads(settings):
    # A node away through a failover learns the new epoch on its way back, so a deposed
    # leader's late command is refused even if the announcement expired meanwhile.
    from fleet import leadership

    settings.LEADER_LEASE_KEY = f"llmgw:test-lease:{node_token('epoch')[-8:]}"
    lease = await database_sync_to_async(leadership.acquire_or_renew)()  # this control plane leads
    ws = communicator("node01")
    assert (await ws.connect())[0]
    await ws.send_to(text_data=register("node01"))
    answer = json.loads(await ws.receive_from())
    await ws.disconnect()
    conn = leadership.client()
    conn.delete(*conn.keys(settings.LEADER_LEASE_KEY + "*"))

    assert (answer["type"], answer.get("epoch")) == ("linked", lease.epoch), (answer, lease)


def challenged(address: str = "10.9.8.7") -> WebsocketCommunicator:
    """A socket that asks for the certificate challenge, from ``address``."""
    headers = [(b"x-llmgw-node", b"node01"), (b"x-llmgw-auth", b"certificate")]
    ws = WebsocketCommunicator(application(), "/agent/", headers=headers)
    ws.scope["client"] = [address, 40000]
    return ws


async def test_a_socket_that_never_answers_the_challenge_is_closed(settings):
    # Each one held a descriptor and a consumer for as long as daphne kept it (24 h).
    settings.LLMGW_NODE_AUTH = "certificate"
    settings.LINK_PROOF_TIMEOUT = 0.2
    ws = challenged()
    await ws.connect()
    assert json.loads(await ws.receive_from())["type"] == "challenge"
    refusal = json.loads(await ws.receive_from(timeout=5))
    assert refusal["type"] == "refused"
    assert "did not answer the challenge within 0.2 s" in refusal["reason"]
    assert (await ws.receive_output(timeout=5))["type"] == "websocket.close"


async def test_the_101st_unproven_socket_from_one_address_is_refused(settings):
    settings.LLMGW_NODE_AUTH = "certificate"
    settings.LINK_PENDING_PER_ADDRESS = 100
    pending = [challenged() for _ in range(100)]
    try:
        for ws in pending:
            await ws.connect()
            assert json.loads(await ws.receive_from())["type"] == "challenge"
        one_more = challenged()
        await one_more.connect()
        refusal = json.loads(await one_more.receive_from())
        assert refusal["type"] == "refused"
        assert "100 links from 10.9.8.7 are waiting to prove themselves" in refusal["reason"]
        assert "LLMGW_LINK_PENDING_PER_ADDRESS" in refusal["reason"]
        assert await consumer_ended(one_more)

        elsewhere = challenged("10.9.8.8")  # another address is not held up by this one's
        await elsewhere.connect()
        assert json.loads(await elsewhere.receive_from())["type"] == "challenge"
        await elsewhere.disconnect()
        await pending.pop().disconnect()  # one that goes away frees its place
        again = challenged()
        await again.connect()
        assert json.loads(await again.receive_from())["type"] == "challenge"
        pending.append(again)
    finally:
        for ws in pending:
            await ws.disconnect()
