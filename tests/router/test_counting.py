"""What an answer cut short served, in the client's API's own events (forward/counting.py
reads them through migration.Progress): chat completions, Messages and Responses."""

from __future__ import annotations

import json

from router.forward.migration import Relayed


def events(*chunks: dict) -> bytes:
    return b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks)


def test_the_text_of_a_messages_stream_is_read():
    relayed = Relayed()
    relayed.keep(events(
        {"type": "message_start", "message": {"id": "msg_1", "usage": {"input_tokens": 5}}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text"}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hi "}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "you"}},
        {"type": "content_block_stop", "index": 0},
    ))  # fmt: skip
    progress = relayed.read()
    assert (progress.text, progress.chunks) == ("Hi you", 2)


def test_the_text_of_a_responses_stream_is_read():
    relayed = Relayed()
    relayed.keep(events(
        {"type": "response.created", "response": {"id": "resp_1"}},
        {"type": "response.output_text.delta", "item_id": "m", "delta": "Hel"},
        {"type": "response.output_text.delta", "item_id": "m", "delta": "lo"},
    ))  # fmt: skip
    progress = relayed.read()
    assert (progress.text, progress.chunks) == ("Hello", 2)
    assert progress.id is None  # a Responses stream is never carried on


def test_a_chat_stream_reads_as_before():
    relayed = Relayed()
    relayed.keep(events(
        {"id": "c1", "choices": [{"index": 0, "delta": {"role": "assistant", "content": "a"}}]},
        {"id": "c1", "choices": [{"index": 0, "delta": {"content": "b"}, "finish_reason": "stop"}]},
    ))  # fmt: skip
    progress = relayed.read()
    assert (progress.text, progress.chunks, progress.finish_reason) == ("ab", 2, "stop")
