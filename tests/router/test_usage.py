"""Usage read from engine answers: whole bodies and server-sent event streams."""

from __future__ import annotations

import json

import pytest

from router.wire.tokens import EventScanner, Tokens, usage_of_body


def event(payload) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


CONTENT = event({"choices": [{"index": 0, "delta": {"content": "hi"}}], "usage": None})
USAGE_ONLY = event({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 7}})
DONE = b"data: [DONE]\n\n"


def test_usage_of_a_whole_answer():
    body = json.dumps(
        {
            "choices": [{"message": {"content": 'a "usage": {"prompt_tokens": 99} b'}}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 4, "details": {"cached": 1}},
        }
    ).encode()
    assert usage_of_body(body) == Tokens(3, 4)


def test_usage_of_an_embeddings_answer_has_no_completion_tokens():
    body = json.dumps(
        {"data": [{"embedding": [0.1] * 5000}], "usage": {"prompt_tokens": 8, "total_tokens": 8}}
    ).encode()
    assert usage_of_body(body) == Tokens(8, 0)


@pytest.mark.parametrize("body", [b"{}", b"not json", b'{"usage": {"prompt_tokens": "x"}}'])
def test_no_usage_is_none(body):
    assert usage_of_body(body) is None


def test_usage_only_chunk_is_dropped_when_the_client_did_not_ask():
    scanner = EventScanner(drop_usage_only=True)
    out = scanner.feed(CONTENT + USAGE_ONLY + DONE)
    assert out == CONTENT + DONE
    assert scanner.tokens == Tokens(5, 7)


def test_usage_only_chunk_is_kept_when_the_client_asked():
    scanner = EventScanner(drop_usage_only=False)
    assert scanner.feed(CONTENT + USAGE_ONLY + DONE) == CONTENT + USAGE_ONLY + DONE
    assert scanner.tokens == Tokens(5, 7)


def test_events_split_anywhere_come_out_whole_and_in_order():
    stream = CONTENT + CONTENT + USAGE_ONLY + DONE
    for cut in range(1, len(stream)):
        scanner = EventScanner(drop_usage_only=True)
        out = scanner.feed(stream[:cut]) + scanner.feed(stream[cut:]) + scanner.flush()
        assert out == CONTENT + CONTENT + DONE, cut
        assert scanner.tokens == Tokens(5, 7)


def test_usage_riding_on_a_content_chunk_is_counted_and_the_chunk_kept():
    chunk = event(
        {
            "choices": [{"delta": {"content": "x"}}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 2},
        }
    )
    scanner = EventScanner(drop_usage_only=True)
    assert scanner.feed(chunk) == chunk
    assert scanner.tokens == Tokens(1, 2)


def test_crlf_framed_events_are_understood():
    usage = USAGE_ONLY.replace(b"\n\n", b"\r\n\r\n")
    scanner = EventScanner(drop_usage_only=True)
    assert scanner.feed(usage + DONE) == DONE
    assert scanner.tokens == Tokens(5, 7)


def test_an_unterminated_last_event_is_passed_on_at_the_end():
    scanner = EventScanner(drop_usage_only=True)
    assert scanner.feed(b"data: [DONE]") == b""
    assert scanner.flush() == b"data: [DONE]"
