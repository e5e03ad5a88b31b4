"""The continuation logic on its own (router/forward/migration.py): what a client has, what the next
engine is asked, and how its answer is spliced onto the first."""

from __future__ import annotations

import json

import pytest

from router.forward import migration
from router.forward.migration import (
    CHAT,
    COMPLETIONS,
    Progress,
    Relayed,
    Splice,
    budget_spent,
    closing_events,
    continuation_body,
    engine_continues,
    why_not_movable,
)
from tests.router.standin import events


def event(**chunk) -> bytes:
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


def delta(text: str | None = None, finish: str | None = None, **more) -> bytes:
    content = {"content": text, **more} if text is not None else more
    return event(id="chatcmpl-a", created=100, model="m", object="chat.completion.chunk",
                 choices=[{"index": 0, "delta": content, "finish_reason": finish}])  # fmt: skip


def progress_of(*events_: bytes) -> Progress:
    relayed = Relayed()
    for data in events_:
        relayed.keep(data)
    return relayed.read()


CHAT_BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}


# -- what the client has ----------------------------------------------------------------------


def test_progress_reads_id_text_role_and_tokens_from_what_was_relayed():
    progress = progress_of(delta(role="assistant"), delta("Hello"), delta(","), delta(" wor"))
    assert (progress.id, progress.created, progress.model) == ("chatcmpl-a", 100, "m")
    assert progress.text == "Hello, wor" and progress.chunks == 3
    assert progress.role_sent and not progress.finish_reason


def test_progress_notes_a_tool_call_reasoning_and_a_finish():
    call = [{"index": 0, "id": "c", "function": {"name": "f", "arguments": ""}}]
    progress = progress_of(delta(tool_calls=call), delta(reasoning_content="hm"),
                           delta(None, finish="stop"))  # fmt: skip
    assert progress.tool_call and progress.reasoning and progress.finish_reason == "stop"


def test_what_is_kept_is_read_as_it_goes_once_it_is_large(monkeypatch):
    monkeypatch.setattr(migration, "FOLD_BYTES", 200)
    relayed = Relayed()
    for n in range(50):
        relayed.keep(delta(f"t{n} "))
    assert len(relayed._kept) <= 200 + len(delta("t49 "))
    assert relayed.read().text == "".join(f"t{n} " for n in range(50))


# -- what may move ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "body", "relayed", "why"),
    [
        (CHAT, CHAT_BODY, [delta("a")], None),
        (CHAT, {**CHAT_BODY, "n": 2}, [delta("a")], "several choices"),
        (CHAT, CHAT_BODY, [delta(tool_calls=[{"index": 0}])], "tool call"),
        (CHAT, CHAT_BODY, [delta(reasoning_content="x")], "reasoning"),
        (CHAT, {**CHAT_BODY, "response_format": {"type": "json_object"}}, [delta("{")], "format"),
        (CHAT, {**CHAT_BODY, "response_format": {"type": "text"}}, [delta("a")], None),
        (CHAT, {**CHAT_BODY, "grammar": "root ::= x"}, [delta("x")], "format"),
        (CHAT, {**CHAT_BODY, "messages": [{"role": "user", "content": "hi"},
                                          {"role": "assistant", "content": "Sure"}]},
         [delta("a")], "assistant message of its own"),
        (COMPLETIONS, {"model": "m", "prompt": "once"}, [], None),
        (COMPLETIONS, {"model": "m", "prompt": ["once"]}, [], None),
        (COMPLETIONS, {"model": "m", "prompt": [1, 2, 3]}, [], "token ids"),
        (COMPLETIONS, {"model": "m", "prompt": ["a", "b"]}, [], "several prompts"),
        (COMPLETIONS, {"model": "m", "prompt": "once", "echo": True}, [], "echoed"),
    ],
    ids=["plain", "n-2", "tool-call", "reasoning", "json", "text-format", "grammar",
         "client-prefill", "prompt", "one-prompt-list", "token-ids", "two-prompts", "echo"],
)  # fmt: skip
def test_which_broken_answers_may_move(path, body, relayed, why):
    found = why_not_movable(path, body, progress_of(*relayed))
    assert (found is None) if why is None else (why in found), found


@pytest.mark.parametrize(
    ("engine", "able"),
    [("", True), ("llama.cpp", True), ("vllm", True), ("sglang", False)],
    ids=["not-said", "llama.cpp", "vllm", "sglang"],
)
def test_which_engines_continue(engine, able):
    assert engine_continues(engine) is able


# -- what the next engine is asked ------------------------------------------------------------


def test_a_chat_continues_its_partial_answer_with_what_is_left_of_its_budget():
    body = {**CHAT_BODY, "max_tokens": 50, "max_completion_tokens": 40, "seed": 3, "top_p": 0.9}
    progress = progress_of(delta(role="assistant"), delta("Once"), delta(" upon"))
    asked = json.loads(continuation_body(CHAT, body, progress))
    assert asked == {
        **body, "max_tokens": 48, "max_completion_tokens": 38,
        "messages": [*body["messages"], {"role": "assistant", "content": "Once upon"}],
        "continue_final_message": True, "add_generation_prompt": False,
    }  # fmt: skip


def test_a_chat_with_nothing_relayed_is_asked_again_as_it_was():
    progress = progress_of(delta(role="assistant"))
    assert json.loads(continuation_body(CHAT, CHAT_BODY, progress)) == CHAT_BODY


def test_a_completion_continues_from_its_prompt_and_text():
    text = event(id="c", choices=[{"index": 0, "text": " there", "finish_reason": None}])
    asked = json.loads(continuation_body(COMPLETIONS, {"prompt": ["Hi"], "max_tokens": 4},
                                         progress_of(text)))  # fmt: skip
    assert asked == {"prompt": "Hi there", "max_tokens": 3}


def test_a_spent_budget_and_a_relayed_finish_end_the_answer_here():
    progress = progress_of(delta("a"), delta("b"))
    assert budget_spent({"max_tokens": 2}, progress)
    assert not budget_spent({"max_tokens": 3}, progress)
    ended = events(closing_events(CHAT, progress).decode())
    assert ended[0]["id"] == "chatcmpl-a" and ended[0]["choices"][0]["finish_reason"] == "length"
    assert ended[1] == "[DONE]"
    finished = progress_of(delta("a"), delta(None, finish="stop"))
    assert closing_events(CHAT, finished) == b"data: [DONE]\n\n"


# -- the splice -------------------------------------------------------------------------------


def continuation(*texts: str, usage: dict | None = None) -> bytes:
    def chunk(choices, **extra):
        return event(id="chatcmpl-b", created=200, model="m-b", object="chat.completion.chunk",
                     choices=choices, **extra)  # fmt: skip

    out = chunk([{"index": 0, "delta": {"role": "assistant", "content": None},
                  "finish_reason": None}])  # fmt: skip
    for text in texts:
        out += chunk([{"index": 0, "delta": {"content": text}, "finish_reason": None}])
    out += chunk([{"index": 0, "delta": {}, "finish_reason": "stop"}])
    if usage:
        out += chunk([], usage=usage)
    return out + b"data: [DONE]\n\n"


@pytest.mark.parametrize("split", [1, 7, 50, 10_000], ids=["bytes", "small", "mid", "whole"])
def test_the_continuation_reads_as_the_rest_of_the_first_answer(split):
    progress = progress_of(delta(role="assistant"), delta("Once"), delta(" upon"))
    splice = Splice(progress, drop_usage_only=False)
    data = continuation(" a", " time", usage={"prompt_tokens": 12, "completion_tokens": 2,
                                               "total_tokens": 14})  # fmt: skip
    out = b"".join(splice.feed(data[i : i + split]) for i in range(0, len(data), split))
    out += splice.flush()
    spliced = events(out.decode())
    chunks = spliced[:-1]
    assert spliced[-1] == "[DONE]"
    assert {(c["id"], c["created"], c["model"]) for c in chunks} == {("chatcmpl-a", 100, "m")}
    assert all("role" not in c["choices"][0]["delta"] for c in chunks if c["choices"])
    assert [c["choices"][0]["delta"].get("content") for c in chunks if c["choices"]] == [
        " a", " time", None]  # fmt: skip
    # The prompt once (the continuation's held the 2 tokens already sent), every token sent.
    assert chunks[-1]["usage"] == {"prompt_tokens": 10, "completion_tokens": 4,
                                   "total_tokens": 14}  # fmt: skip
    assert (splice.tokens.prompt, splice.tokens.completion) == (10, 4)


def test_a_usage_chunk_the_client_did_not_ask_for_is_counted_and_dropped():
    splice = Splice(progress_of(delta("x")), drop_usage_only=True)
    out = splice.feed(continuation(" y", usage={"prompt_tokens": 5, "completion_tokens": 1}))
    assert all(c == "[DONE]" or "usage" not in c for c in events(out.decode()))
    assert (splice.tokens.prompt, splice.tokens.completion) == (4, 2)


def test_an_error_event_from_the_continuation_passes_as_it_came():
    error = b'data: {"error": {"message": "boom", "code": "x"}}\n\n'
    splice = Splice(progress_of(delta("x")), drop_usage_only=False)
    assert splice.feed(error) == error
