"""Hostile /v1 bodies against a real router process (uvicorn) and its engines.

Every one gets an answer below 500 in OpenAI's error shape, naming what is wrong,
and never a traceback.
"""

from __future__ import annotations

import httpx
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from tests.fuzz.hostile import DEEP, deep_json, dumps, mutated, raw_frames
from tests.router.conftest import FULL_KEY, MAX_BODY

AUTH = {"Authorization": f"Bearer {FULL_KEY}", "Content-Type": "application/json"}
CHAT = {"model": "solo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
VALID = {
    "/v1/chat/completions": [CHAT, {**CHAT, "stream": True, "n": 1, "temperature": 0.5}],
    "/v1/completions": [{"model": "solo", "prompt": "once", "max_tokens": 4}],
    "/v1/embeddings": [{"model": "solo", "input": ["a", "b"]}],
    # The static table names no native APIs: these are translated onto chat completions.
    "/v1/responses": [
        {"model": "solo", "input": "hi", "max_output_tokens": 4},
        {
            "model": "solo",
            "stream": True,
            "instructions": "be brief",
            "input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}],
            "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
        },
    ],
    "/v1/messages": [
        {
            "model": "solo",
            "max_tokens": 4,
            "system": "be brief",
            "stream": True,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
        },
        {
            "model": "solo",
            "max_tokens": 4,
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"name": "f", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "auto"},
        },
    ],
    "/v1/messages/count_tokens": [
        {"model": "solo", "messages": [{"role": "user", "content": "hi"}]}
    ],
    "/v1/rerank": [{"model": "solo", "query": "q", "documents": ["a", "b"], "top_n": 1}],
    "/v1/audio/speech": [{"model": "solo", "input": "hello", "voice": "x"}],
    "/v1/audio/transcriptions": [{"model": "solo", "file": "not an upload"}],
    "/v1/images/generations": [{"model": "solo", "prompt": "a cat", "n": 1}],
    "/tokenize": [{"model": "solo", "content": "hi"}],
    "/detokenize": [{"model": "solo", "tokens": [1, 2]}],
}
KEYS = ("stream", "n", "max_tokens", "messages", "prompt", "input", "model", "stream_options",
        "temperature", "max_completion_tokens", "system", "tools", "tool_choice", "content",
        "instructions", "max_output_tokens", "documents", "query", "tokens", "type", "text",
        "previous_response_id")  # fmt: skip


def as_bytes(text: str) -> bytes:
    return text.encode(errors="surrogatepass")  # a lone surrogate goes out as it is


bodies = st.sampled_from(sorted(VALID)).flatmap(
    lambda path: st.tuples(
        st.just(path),
        st.one_of(mutated(VALID[path], KEYS).map(dumps), raw_frames).map(as_bytes),
    )
)

BIG = "<over the router's body limit>"  # by name, so a failure's report does not print it


def expand(body: bytes) -> bytes:
    return b'{"model": "solo", "pad": "' + b"x" * (MAX_BODY + 1) + b'"}' if body == BIG else body


@given(request=bodies)
@example(request=("/v1/chat/completions", BIG))
@example(request=("/v1/chat/completions", deep_json(DEEP).encode()))
@example(request=("/v1/chat/completions", b'{"model": "solo", "messages": ' + b"[" * DEEP))
@example(request=("/v1/completions", b"\xff\xfe not utf-8"))
def test_hostile_bodies_get_a_4xx_that_says_why(shared, request):
    path, body = request
    response = httpx.post(shared.url + path, content=expand(body), headers=AUTH, timeout=30)
    assert response.status_code < 500, response.text[:500]
    assert "Traceback" not in response.text
    if response.status_code >= 400:
        error = response.json()["error"]
        assert error["message"] and error["type"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "solo"}, "messages"),
        ({**CHAT, "messages": []}, "messages"),
        ({**CHAT, "messages": "hi"}, "messages"),
        ({**CHAT, "stream": "yes"}, "stream"),
        ({**CHAT, "max_tokens": -1}, "max_tokens"),
        ({**CHAT, "max_tokens": True}, "max_tokens"),
        ({**CHAT, "n": 10**6}, "n"),
        ({**CHAT, "temperature": "hot"}, "temperature"),
        ({**CHAT, "stream_options": []}, "stream_options"),
    ],
    ids=[
        "no-messages",
        "empty-messages",
        "messages-text",
        "stream-text",
        "negative-max-tokens",
        "bool-max-tokens",
        "huge-n",
        "temperature-text",
        "stream-options-list",
    ],  # fmt: skip
)
def test_a_field_an_engine_cannot_use_is_named_before_any_replica_sees_it(shared, body, param):
    response = httpx.post(shared.url + "/v1/chat/completions", json=body, headers=AUTH, timeout=30)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == param and f"`{param}`" in error["message"]
    assert not shared.engines["C"].requests()
