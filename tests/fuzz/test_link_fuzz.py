"""Hostile frames on the agent link, against the real consumer, PostgreSQL and Redis.

Every frame is answered with an error or refused with a closed link and a reason; none
ends the consumer with an exception, and none that the protocol refuses changes a row.
"""

from __future__ import annotations

import json
from itertools import count

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.test import override_settings
from hypothesis import example, given
from hypothesis import strategies as st

from audit.models import Event
from fleet.models import Node, Replica, Shard
from fleet.pki.tokens import node_token
from fleet.websockets import websocket_urlpatterns
from protocol import messages
from protocol.inventory import NodeUsage
from tests.factories import make_replica, make_shard
from tests.fleet.inventories import inventory
from tests.fuzz.hostile import dumps, mutated, raw_frames

pytestmark = pytest.mark.django_db(transaction=True)

NODE = "fuzz-node"
SHARD = "fuzz-shard-0"
MAX_FRAME = 64 * 1024
probes = count()
TEN_MB = "<10 MB of x>"  # by name, so that a failure's report does not print it


def expand(frame: str | bytes) -> str | bytes:
    return "x" * (10 * 1024 * 1024) if frame == TEN_MB else frame


def valid_messages() -> list[dict]:
    """One message of every kind, as a well-behaved agent sends them."""
    usage = NodeUsage(cpu_percent=10, load=(1, 1, 1), memory_total=1 << 30, memory_used=1 << 20,
                  memory_available=1 << 29)  # fmt: skip
    return [
        json.loads(m.model_dump_json())
        for m in (
            messages.Register(inventory=inventory(NODE), engines_probed=True),
            messages.Heartbeat(usage=usage),
            messages.ShardStatus(shard_id=SHARD, state="ready", pid=123, seq=1),
            messages.ShardProgress(shard_id=SHARD, bytes=10, total=100, rate=1.0),
            messages.Engines(engines=[]),
            messages.Weights(weights=[]),
            messages.CommandRefused(task="agent.start_shard", reason="unsigned"),
        )
    ]


REGISTER = valid_messages()[0]
ANOTHER_HOST = dumps({**REGISTER, "inventory": {**REGISTER["inventory"], "hostname": "other"}})
KEYS = ("type", "shard_id", "inventory", "usage", "state", "pid", "seq", "bytes", "engines")
frames = st.one_of(raw_frames, mutated(valid_messages(), KEYS).map(dumps))


def rows() -> tuple:
    """What a refused frame must leave as it was."""
    return (
        sorted(Node.objects.values_list("id", "state", "address", "engines", "weights")),
        sorted(Shard.objects.values_list("id", "state", "pid", "reason")),
        sorted(Replica.objects.values_list("id", "state")),
        Event.objects.count(),
    )


def communicator(headers: list[tuple[bytes, bytes]]) -> WebsocketCommunicator:
    return WebsocketCommunicator(URLRouter(websocket_urlpatterns), "/agent/", headers=headers)


async def send_frame(ws: WebsocketCommunicator, frame: str | bytes) -> None:
    """Any frame, the empty one too (send_to refuses to send nothing)."""
    key = "bytes" if isinstance(frame, bytes) else "text"
    await ws.send_input({"type": "websocket.receive", key: frame})


async def outputs_until_done(ws: WebsocketCommunicator, probe: str) -> list[dict]:
    """What the consumer sent until it answered ``probe`` or closed the link."""
    sent = []
    while True:
        output = await ws.receive_output(timeout=10)
        sent.append(output)
        if output["type"] == "websocket.close" or probe in output.get("text", ""):
            return sent


async def exchange(frame: str | bytes) -> tuple[tuple, list[dict]]:
    """Link as the node, send ``frame`` and then a probe; return the rows as they were
    just before the frame, and what came back."""
    ws = communicator(
        [
            (b"x-llmgw-node", NODE.encode()),
            (b"authorization", f"Bearer {node_token(NODE)}".encode()),
        ]
    )
    connected, _ = await ws.connect()
    assert connected
    await ws.send_to(text_data=json.dumps(valid_messages()[0]))
    assert json.loads(await ws.receive_from(timeout=10))["type"] == "linked"
    before = await database_sync_to_async(rows)()
    await send_frame(ws, frame)
    probe = f"probe-{next(probes)}"
    await ws.send_to(text_data=json.dumps({"type": probe}))
    sent = await outputs_until_done(ws, probe)
    await ws.disconnect()
    # The consumer ended by itself (a refusal) or by the disconnect, never by an exception.
    assert ws.future.done() and ws.future.exception() is None, ws.future.exception()
    return before, sent


@pytest.fixture
def linked_node_with_a_shard(db):
    async_to_sync(exchange)("{}")  # the node's row, as its first register leaves it
    make_shard(make_replica(), id=SHARD, node_id=NODE, state="starting", port=20000)


@override_settings(LINK_MAX_FRAME=MAX_FRAME)
@given(frame=frames)
@example(frame=TEN_MB)  # refused by size before parsing
@example(frame=b"\xff\xfe" * 100)
@example(frame=ANOTHER_HOST)
def test_hostile_link_frames_are_answered_or_refused(linked_node_with_a_shard, frame):
    frame = expand(frame)
    try:
        parsed = messages.parse_message(frame)
    except messages.MessageError:
        parsed = None
    before, sent = async_to_sync(exchange)(frame)
    answers = [json.loads(o["text"]) for o in sent if o["type"] == "websocket.send"]
    closed = [o for o in sent if o["type"] == "websocket.close"]
    if closed:
        # A closed link always says why first.
        assert answers and answers[-1]["type"] == "refused" and answers[-1]["reason"]
    if parsed is None:
        assert rows() == before, "a refused frame changed a row"
        assert closed or any(a["type"] == "error" and a["reason"] for a in answers[:-1])


proofs = st.one_of(
    raw_frames,
    st.fixed_dictionaries(
        {"certificate": st.one_of(st.text(max_size=300), st.integers()),
         "signature": st.one_of(st.text(max_size=100), st.binary(max_size=64).map(bytes.hex))}
    ).map(dumps),
)  # fmt: skip


@override_settings(LLMGW_NODE_AUTH="certificate", LINK_MAX_FRAME=MAX_FRAME)
@given(proof=proofs)
@example(proof=TEN_MB)
def test_hostile_answers_to_the_certificate_challenge_are_refused(db, proof):
    proof = expand(proof)
    before = rows()

    async def answer() -> list[dict]:
        ws = communicator([(b"x-llmgw-node", NODE.encode()), (b"x-llmgw-auth", b"certificate")])
        await ws.connect()
        assert json.loads(await ws.receive_from(timeout=10))["type"] == "challenge"
        await send_frame(ws, proof)
        sent = await outputs_until_done(ws, "\x00never")
        await ws.disconnect()
        assert ws.future.done() and ws.future.exception() is None, ws.future.exception()
        return sent

    sent = async_to_sync(answer)()
    [refusal] = [json.loads(o["text"]) for o in sent if o["type"] == "websocket.send"]
    assert refusal["type"] == "refused" and NODE in refusal["reason"]
    assert sent[-1]["type"] == "websocket.close"
    assert rows() == before


@override_settings(LINK_MAX_FRAME=MAX_FRAME)
def test_an_oversized_frame_closes_the_link_before_it_is_parsed(linked_node_with_a_shard):
    before, sent = async_to_sync(exchange)("{" + " " * MAX_FRAME)
    [refusal] = [json.loads(o["text"]) for o in sent if o["type"] == "websocket.send"]
    assert refusal["type"] == "refused"
    assert f"over the limit of {MAX_FRAME} (LLMGW_LINK_MAX_FRAME)" in refusal["reason"]
    assert sent[-1] == {"type": "websocket.close", "code": messages.CLOSE_BAD_MESSAGE}
    assert rows() == before
