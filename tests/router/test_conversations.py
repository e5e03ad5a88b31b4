"""Responses conversations the router keeps: bound in size and time, by key, shared by the
routers through the real Redis, and put into the input of the request that continues one."""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest
from django.conf import settings

from router import conversations
from router.conversations.chains import Chain, continued
from router.conversations.store import KEY_PREFIX, ConversationStore, Kept
from router.errors import RouterError
from router.table.keys import Caller

pytestmark = pytest.mark.asyncio

ALICE = Caller(name="alice", prefix="llmgw_aaaa", models=frozenset())
BOB = Caller(name="bob", prefix="llmgw_bbbb", models=frozenset())


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def answer(text: str, status: str = "completed") -> dict:
    return {
        "id": f"resp_{uuid.uuid4().hex}", "object": "response", "status": status,
        "output": [
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
             "content": [{"type": "output_text", "text": text, "annotations": []}]},
        ],
    }  # fmt: skip


async def turn(store: ConversationStore, payload: dict, caller: Caller = ALICE) -> tuple:
    """One request through ``continued``, answered: what the engine was asked, and the
    response the client got (kept as the relay keeps a whole answer)."""
    found = await continued(store, {"model": "m", **payload}, caller, "m")
    given = found.payload["input"]
    response = answer(f"answer to {given if isinstance(given, str) else given[-1]['content']}")
    if found.chain is not None:
        found.chain.keep_answer(json.dumps(response).encode())
    return found, response


async def test_a_chain_puts_the_whole_conversation_so_far_into_the_input():
    store = ConversationStore()
    first, said = await turn(store, {"input": "My name is Zorblax.", "instructions": "Be terse."})
    assert first.payload["input"] == "My name is Zorblax." and not first.expanded
    second, _ = await turn(store, {"input": [{"role": "user", "content": "And?"}],
                                   "previous_response_id": said["id"]})  # fmt: skip
    assert second.expanded and "previous_response_id" not in second.payload
    assert second.payload["input"] == [
        {"type": "message", "role": "user", "content": "My name is Zorblax."},
        said["output"][1],  # the answer, its reasoning left out
        {"role": "user", "content": "And?"},
    ]  # fmt: skip
    assert "instructions" not in second.payload  # as OpenAI: not carried over


async def test_another_keys_response_is_unknown_and_store_false_keeps_nothing():
    store = ConversationStore()
    _, said = await turn(store, {"input": "hi"})
    with pytest.raises(RouterError) as refused:
        await turn(store, {"input": "x", "previous_response_id": said["id"]}, BOB)
    assert refused.value.status == 404 and refused.value.code == "response_not_found"
    unkept, response = await turn(store, {"input": "x", "store": False})
    assert unkept.chain is None and await store.recall(response["id"]) is None
    # An id this router does not keep is left as it is, for the engine-kept path.
    elsewhere = await continued(store, {"input": "x", "previous_response_id": "resp_x"}, ALICE,
                                "m")  # fmt: skip
    assert elsewhere.chain is None and elsewhere.payload["previous_response_id"] == "resp_x"


async def test_a_conversation_over_its_bound_is_refused_saying_why():
    store = ConversationStore(max_bytes=2000)
    long_input = [{"role": "user", "content": "x" * 3000}, {"role": "user", "content": "hi"}]
    _, said = await turn(store, {"input": long_input})
    with pytest.raises(RouterError) as refused:
        await turn(store, {"input": "more", "previous_response_id": said["id"]})
    assert refused.value.status == 400 and refused.value.code == "conversation_too_long"
    assert "LLMGW_ROUTER_CONVERSATION_BYTES" in refused.value.message
    kept = await store.recall(said["id"])
    assert kept is not None and kept.too_long and kept.response == said  # GET still answers


async def test_a_kept_conversation_expires():
    clock = Clock()
    store = ConversationStore(seconds=60, clock=clock)
    store.keep(Kept("resp_1", ALICE.owner, "m"))
    clock.now += 59
    assert await store.recall("resp_1") is not None
    clock.now += 2
    assert await store.recall("resp_1") is None


async def test_memory_drops_the_least_recently_used_past_its_bound(monkeypatch):
    monkeypatch.setattr(conversations.store, "MEMORY_BYTES", 1000)
    store = ConversationStore()
    for n in range(4):
        store.keep(Kept(f"resp_{n}", "o", "m", [{"content": "x" * 300}]))
    assert await store.recall("resp_0") is None
    assert await store.recall("resp_3") is not None


async def test_a_stream_is_kept_from_the_event_that_ends_it_before_it_goes_out():
    store = ConversationStore()
    chain = Chain(store, ALICE.owner, "m", [{"type": "message", "role": "user",
                                                 "content": "hi"}])  # fmt: skip
    response = answer("hello")
    done = json.dumps({"type": "response.completed", "response": response}).encode()
    stream = (b"event: response.created\ndata: {}\n\n"
              b"event: response.completed\ndata: " + done + b"\n\n")  # fmt: skip
    edit, flush = chain.watching(lambda data: data, lambda: b"")
    for at in range(0, len(stream), 7):  # in pieces, as a network delivers them
        assert edit(stream[at : at + 7]) == stream[at : at + 7]
        if at + 7 < len(stream):
            assert await store.recall(response["id"]) is None  # not before it is whole
    flush()
    kept = await store.recall(response["id"])
    assert kept is not None and kept.items[-1]["content"][0]["text"] == "hello"


async def test_a_conversation_kept_by_one_router_is_continued_through_another():
    url = settings.REDIS_URL
    first, second = (ConversationStore(lambda: url, seconds=30) for _ in range(2))
    try:
        _, said = await turn(first, {"input": "My name is Zorblax."})
        await asyncio.gather(*first._writing)
        found, _ = await turn(second, {"input": "Who?", "previous_response_id": said["id"]})
        assert found.payload["input"][0]["content"] == "My name is Zorblax."
        ttl = await second._shared().ttl(KEY_PREFIX + said["id"])
        assert 0 < ttl <= 30
        await second.forget(said["id"])
        assert await ConversationStore(lambda: url).recall(said["id"]) is None
    finally:
        await first.close()
        await second.close()
