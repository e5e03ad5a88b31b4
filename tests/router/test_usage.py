"""Usage read from engine answers: whole bodies and server-sent event streams."""

from __future__ import annotations

import json

import pytest

from router.wire.tokens import EventScanner, Tokens, tokens_of, usage_of_body


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


@pytest.mark.parametrize("ending", [b"\n\n", b"\r\n\r\n", b"\r\r"])
def test_events_without_usage_pass_whole_whatever_their_line_endings(ending):
    """The reads that end on an event's end and name no usage (nearly every read of a
    stream) pass as they came; those that end mid-event keep the rest for the next."""
    plain = b'data: {"choices": [{"delta": {"content": "hi"}}]}' + ending
    last = b'data: {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 7}}'
    stream = plain + plain + last + ending
    for cut in range(1, len(stream)):
        scanner = EventScanner(drop_usage_only=True)
        first = scanner.feed(stream[:cut])
        assert scanner.mid_event == (not stream[:cut].endswith(ending)), cut
        out = first + scanner.feed(stream[cut:]) + scanner.flush()
        assert out == plain + plain, cut
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


# -- every prompt token (issue 41 item 5) ----------------------------------------------------


@pytest.mark.parametrize(
    "usage",
    [
        # llama-server's Messages API: input_tokens leaves out what its cache held.
        {"input_tokens": 1, "cache_read_input_tokens": 31, "output_tokens": 5},
        # Anthropic's, with a cache write too: every part is prompt.
        {"input_tokens": 1, "cache_read_input_tokens": 31, "cache_creation_input_tokens": 0,
         "output_tokens": 5},
        # OpenAI's chat completions: the cached part is inside prompt_tokens.
        {"prompt_tokens": 32, "completion_tokens": 5,
         "prompt_tokens_details": {"cached_tokens": 31}},
        # The Responses API: likewise, inside input_tokens.
        {"input_tokens": 32, "output_tokens": 5, "input_tokens_details": {"cached_tokens": 31}},
    ],
    ids=["llama-messages", "anthropic-parts", "chat", "responses"],
)  # fmt: skip
def test_the_whole_prompt_is_counted_with_its_cached_part_apart(usage):
    assert tokens_of(usage) == Tokens(prompt=32, completion=5, cached=31)


def test_a_cache_write_is_prompt_too():
    usage = {"input_tokens": 2, "cache_creation_input_tokens": 40, "output_tokens": 1}
    assert tokens_of(usage) == Tokens(prompt=42, completion=1, cached=0)


def test_a_messages_stream_counts_the_cached_prompt_its_start_names():
    start = {"type": "message_start", "message": {"usage": {
        "input_tokens": 1, "cache_read_input_tokens": 31, "output_tokens": 0}}}  # fmt: skip
    delta = {"type": "message_delta", "delta": {"stop_reason": "end_turn"},
             "usage": {"output_tokens": 5}}  # fmt: skip
    scanner = EventScanner(drop_usage_only=False)
    scanner.feed(event(start) + event(delta))
    assert scanner.tokens == Tokens(prompt=32, completion=5, cached=31)


@pytest.mark.django_db
def test_a_usage_row_keeps_the_cached_part_of_the_prompt_apart():
    from router.models import Usage
    from router.usage.accounting import Accounting, write_usage

    accounting = Accounting()
    accounting.record("llmgw-abcd", "team", "gemma", 32, 5, cached_prompt=31)
    accounting.record("llmgw-abcd", "team", "gemma", 10, 2)
    write_usage(accounting.take())
    row = Usage.objects.get()
    assert (row.prompt_tokens, row.cached_prompt_tokens, row.completion_tokens) == (42, 31, 7)
