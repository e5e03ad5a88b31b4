"""When a Messages or Responses request is translated, replica by replica."""

from __future__ import annotations

import json

from router.table.routes import Endpoint
from router.translate.plan import Translation

NATIVE = Endpoint("a", "http://a", b"", "llama.cpp", native=frozenset({"messages", "responses"}))
LACKING = Endpoint("b", "http://b", b"", "sglang", native=frozenset())
MESSAGE = {"model": "alias", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}


def test_translated_only_for_engines_without_the_api_unless_always():
    native_first = Translation.of("/v1/messages", MESSAGE, "gemma", always=False)
    assert native_first is not None
    assert not native_first.applies_to(NATIVE) and native_first.applies_to(LACKING)
    always = Translation.of("/v1/messages", MESSAGE, "gemma", always=True)
    assert always is not None and always.applies_to(NATIVE) and always.applies_to(LACKING)
    assert Translation.of("/v1/chat/completions", MESSAGE, "gemma", always=True) is None


def test_the_engine_is_asked_for_chat_under_the_catalog_name_with_usage_in_the_stream():
    translation = Translation.of("/v1/messages", {**MESSAGE, "stream": True}, "gemma",
                                 always=True)  # fmt: skip
    assert translation is not None
    path, body = translation.engine_request()
    chat = json.loads(body)
    assert path == "/v1/chat/completions"
    assert chat["model"] == "gemma" and chat["stream"] is True
    assert chat["stream_options"] == {"include_usage": True}
    assert chat["messages"][-1] == {"role": "user", "content": "hi"}


def test_counting_tokens_goes_to_an_engines_own_count_even_when_always_translating():
    count = {"model": "alias", "messages": [{"role": "user", "content": "hi"}]}
    translation = Translation.of("/v1/messages/count_tokens", count, "gemma", always=True)
    assert translation is not None
    assert not translation.applies_to(NATIVE) and translation.applies_to(LACKING)
    path, body = translation.engine_request()  # no max_tokens in a count: still translated
    assert path == "/tokenize" and json.loads(body)["messages"][-1]["content"] == "hi"
    assert json.loads(translation.answer(200, b'{"tokens": [1, 2, 3]}')) == {"input_tokens": 3}
