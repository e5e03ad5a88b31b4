"""Anthropic's Messages API served on chat completions, checked with the anthropic SDK.

Each test sends the SDK's own request through ``to_chat``, answers as llama-server would,
and lets the SDK read the translated answer or stream with its own types and parsers.
"""

from __future__ import annotations

import json

import anthropic
import pytest
from anthropic.types import Message, RawMessageStreamEvent
from hypothesis import given
from pydantic import TypeAdapter

from router.errors import RouterError, stream_error_event
from router.translate import messages
from router.translate.message_events import MessageEvents
from router.wire.tokens import Tokens
from tests.fuzz.hostile import mutated
from tests.router.llama_chat import (
    Translated,
    answer,
    as_stream,
    engine_answering,
    error_event,
    sse_events,
    stream,
    stream_chunks,
    tool_call,
    translate_stream,
)

MODEL = "smol"
HELLO = [{"role": "user", "content": "Say hello."}]
WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
EVENTS = TypeAdapter(RawMessageStreamEvent)


def sdk(translated: Translated) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        api_key="x", base_url="http://t", max_retries=0, http_client=translated.client()
    )


# -- requests and answers, through the SDK ------------------------------------------------


def test_a_text_answer_reads_as_a_message():
    translated = Translated(
        messages, engine_answering(answer("Hello there!", prompt=9, completion=4))
    )
    message = sdk(translated).messages.create(
        model=MODEL,
        max_tokens=64,
        system="Be brief.",
        messages=HELLO,
        stop_sequences=["END"],
        metadata={"user_id": "u-1"},
        # Sampling knobs that this SDK no longer names, which older clients still send.
        extra_body={"temperature": 0.2, "top_p": 0.9, "top_k": 40},
    )
    assert translated.chats == [
        {
            "model": MODEL,
            "max_tokens": 64,
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Say hello."},
            ],
            "temperature": 0.2,
            "top_p": 0.9,
            "top_k": 40,
            "stop": ["END"],
            "user": "u-1",
        }
    ]
    assert message.content[0].type == "text" and message.content[0].text == "Hello there!"
    assert message.id.startswith("msg_") and message.model == MODEL
    assert message.stop_reason == "end_turn" and message.stop_sequence is None
    assert (message.usage.input_tokens, message.usage.output_tokens) == (9, 4)


def test_a_conversation_keeps_its_turns_and_joins_consecutive_ones():
    translated = Translated(messages, engine_answering(answer("Paris.")))
    sdk(translated).messages.create(
        model=MODEL,
        max_tokens=16,
        system=[
            {"type": "text", "text": "You know geography."},
            {"type": "text", "text": "Answer in one word.", "cache_control": {"type": "ephemeral"}},
        ],
        messages=[
            {"role": "user", "content": "Hi."},
            {"role": "assistant", "content": [{"type": "text", "text": "Hello."}]},
            {"role": "user", "content": "A question:"},
            {"role": "user", "content": [{"type": "text", "text": "The capital of France?"}]},
        ],
    )
    assert translated.chats[0]["messages"] == [
        {"role": "system", "content": "You know geography.\n\nAnswer in one word."},
        {"role": "user", "content": "Hi."},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "A question:\n\nThe capital of France?"},
    ]


def test_a_tool_call_goes_round_trip():
    call = tool_call("call_abc", "get_weather", '{"city": "Oslo"}')
    engine = engine_answering(
        answer(None, calls=[call], finish="tool_calls"), answer("It is 3 degrees in Oslo.")
    )
    translated = Translated(messages, engine)
    client = sdk(translated)
    asked = [{"role": "user", "content": "Weather in Oslo?"}]
    first = client.messages.create(
        model=MODEL, max_tokens=64, messages=asked, tools=[WEATHER], tool_choice={"type": "auto"}
    )
    assert first.stop_reason == "tool_use"
    [use] = first.content
    assert (use.type, use.id, use.name) == ("tool_use", "call_abc", "get_weather")
    assert use.input == {"city": "Oslo"}
    assert translated.chats[0]["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "The weather in a city.",
                "parameters": WEATHER["input_schema"],
            },
        }
    ]
    assert translated.chats[0]["tool_choice"] == "auto"

    result = {"type": "tool_result", "tool_use_id": use.id,
              "content": [{"type": "text", "text": "3 degrees"}]}  # fmt: skip
    second = client.messages.create(
        model=MODEL,
        max_tokens=64,
        tools=[WEATHER],
        messages=[
            *asked,
            {"role": "assistant", "content": first.content},
            {"role": "user", "content": [result, {"type": "text", "text": "Thanks."}]},
        ],
    )
    assert second.content[0].text == "It is 3 degrees in Oslo."
    assert translated.chats[1]["messages"][1:] == [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_abc",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_abc", "content": "3 degrees"},
        {"role": "user", "content": "Thanks."},
    ]


def test_images_go_as_image_urls():
    translated = Translated(messages, engine_answering(answer("A cat.")))
    base64 = {"type": "base64", "media_type": "image/png", "data": "iVBO"}
    url = {"type": "url", "url": "https://example.com/cat.jpg"}
    blocks = [{"type": "image", "source": base64}, {"type": "image", "source": url},
              {"type": "text", "text": "What is this?"}]  # fmt: skip
    sdk(translated).messages.create(
        model=MODEL, max_tokens=8, messages=[{"role": "user", "content": blocks}]
    )
    assert translated.chats[0]["messages"][0]["content"] == [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBO"}},
        {"type": "image_url", "image_url": {"url": "https://example.com/cat.jpg"}},
        {"type": "text", "text": "What is this?"},
    ]


@pytest.mark.parametrize(
    ("finish", "extra", "reason", "sequence"),
    [
        ("stop", {}, "end_turn", None),
        ("length", {}, "max_tokens", None),
        ("tool_calls", {}, "tool_use", None),
        ("stop", {"stop_reason": "END"}, "stop_sequence", "END"),  # vLLM says which
        ("stop", {"matched_stop": "END"}, "stop_sequence", "END"),  # SGLang too
        ("content_filter", {}, "refusal", None),
    ],
    ids=["stop", "length", "tool-calls", "vllm-stop-string", "sglang-stop-string", "filter"],
)
def test_stop_reasons(finish, extra, reason, sequence):
    translated = Translated(messages, engine_answering(answer("Hi", finish=finish, **extra)))
    message = sdk(translated).messages.create(
        model=MODEL, max_tokens=8, messages=HELLO, stop_sequences=["END"]
    )
    assert (message.stop_reason, message.stop_sequence) == (reason, sequence)


def test_an_engine_error_is_anthropics_error():
    error = {"code": 400, "message": "the request exceeds the context size",
             "type": "exceed_context_size_error"}  # fmt: skip
    body = json.dumps({"error": error}).encode()
    translated = Translated(messages, engine_answering((400, body)))
    with pytest.raises(anthropic.BadRequestError) as raised:
        sdk(translated).messages.create(model=MODEL, max_tokens=8, messages=HELLO)
    assert raised.value.body == {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": "the request exceeds the context size",
        },
    }


@pytest.mark.parametrize(
    ("status", "kind"),
    [(400, "invalid_request_error"), (401, "authentication_error"), (403, "permission_error"),
     (404, "not_found_error"), (413, "request_too_large"), (429, "rate_limit_error"),
     (500, "api_error"), (503, "api_error"), (529, "overloaded_error"),
     (422, "invalid_request_error")],
)  # fmt: skip
def test_error_bodies_take_anthropics_shape(status, kind):
    openai_shaped = json.dumps({"error": {"message": "why", "type": "x", "code": "y"}}).encode()
    assert json.loads(messages.error_body(status, openai_shaped)) == {
        "type": "error",
        "error": {"type": kind, "message": "why"},
    }


def test_an_error_body_that_is_not_json_keeps_its_words():
    body = json.loads(messages.error_body(502, b"Bad Gateway from nginx"))
    assert body["error"] == {"type": "api_error", "message": "Bad Gateway from nginx"}
    assert "HTTP 500" in json.loads(messages.error_body(500, b""))["error"]["message"]


def test_the_routers_own_errors_translate_too():
    error = RouterError(401, "No API key", "invalid_request_error", "missing_api_key")
    assert json.loads(messages.error_body(401, error.body()))["error"] == {
        "type": "authentication_error",
        "message": "No API key",
    }


# -- streams ------------------------------------------------------------------------------


def test_a_streamed_answer_reads_whole_in_the_sdk():
    engine_stream = stream(["Hel", "lo ", "there!"], prompt=9, completion=3)
    translated = Translated(messages, engine_answering(engine_stream), cut=7)
    with sdk(translated).messages.stream(model=MODEL, max_tokens=64, messages=HELLO) as events:
        texts = list(events.text_stream)
        message = events.get_final_message()
    assert texts == ["Hel", "lo ", "there!"]
    assert translated.chats[0]["stream"] is True
    assert translated.chats[0]["stream_options"] == {"include_usage": True}
    assert [block.text for block in message.content] == ["Hello there!"]
    assert message.stop_reason == "end_turn"
    assert (message.usage.input_tokens, message.usage.output_tokens) == (9, 3)
    assert translated.translators[0].usage == Tokens(9, 3)


def test_a_streamed_tool_call_reads_whole_in_the_sdk():
    engine_stream = stream(
        ["Let me look."],
        finish="tool_calls",
        calls=[
            ("call_1", "get_weather", ['{"ci', 'ty": "Os', 'lo"}']),
            ("call_2", "get_weather", ['{"city": "Rome"}']),
        ],
    )
    translated = Translated(messages, engine_answering(engine_stream))
    with sdk(translated).messages.stream(
        model=MODEL, max_tokens=64, messages=HELLO, tools=[WEATHER]
    ) as events:
        message = events.get_final_message()
    text, oslo, rome = message.content
    assert text.text == "Let me look."
    assert (oslo.id, oslo.name, oslo.input) == ("call_1", "get_weather", {"city": "Oslo"})
    assert (rome.id, rome.input) == ("call_2", {"city": "Rome"})
    assert message.stop_reason == "tool_use"


def test_every_event_is_anthropics_own_and_in_order():
    engine_stream = stream(["Hi"], calls=[("c1", "f", ["{}"])], finish="tool_calls")
    events = sse_events(translate_stream(MessageEvents(MODEL), engine_stream))
    for event in events:
        EVENTS.validate_python(event)
    assert [event["type"] for event in events] == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]


def test_a_stream_cut_anywhere_translates_the_same():
    engine_stream = stream(["ñandú ", "☃ ", "end"], calls=[("c1", "f", ['{"a":', " 1}"])])
    whole = translate_stream(MessageEvents(MODEL), engine_stream)
    for size in (1, 3, 50):
        cut = translate_stream(MessageEvents(MODEL), engine_stream, size)
        assert _without_ids(cut) == _without_ids(whole)


def test_an_error_mid_stream_is_anthropics_error_event():
    engine_stream = stream(
        ["Partial"], tail=[error_event("the engine ran out of memory"), b"data: [DONE]\n\n"]
    )
    translated = Translated(messages, engine_answering(engine_stream))
    client = sdk(translated)
    with (
        pytest.raises(anthropic.APIStatusError) as raised,
        client.messages.stream(model=MODEL, max_tokens=64, messages=HELLO) as events,
    ):
        events.get_final_message()
    assert raised.value.body == {
        "type": "error",
        "error": {"type": "api_error", "message": "the engine ran out of memory"},
    }


def test_vllms_older_error_event_is_understood_too():
    events = MessageEvents(MODEL)
    older = {"object": "error", "message": "bad sampling", "type": "BadRequestError", "code": 400}
    data = translate_stream(events, b"data: " + json.dumps(older).encode() + b"\n\n")
    [error] = sse_events(data)
    assert error == {"type": "error", "error": {"type": "invalid_request_error",
                                                "message": "bad sampling"}}  # fmt: skip


def test_the_routers_broken_stream_event_becomes_anthropics():
    events = MessageEvents(MODEL)
    events.feed(stream(["Partial"], tail=[]))
    data = events.feed(stream_error_event("An engine broke off")) + events.flush()
    assert data.startswith(b"event: error\n")
    assert json.loads(data.split(b"data: ", 1)[1])["error"]["message"] == "An engine broke off"
    assert b"message_stop" not in data
    assert messages.stream_error_event("gone").startswith(b"event: error\ndata: ")


def test_a_stream_without_done_still_ends_its_message():
    events = MessageEvents(MODEL)
    data = translate_stream(events, stream(["Hi"], tail=[]))
    assert data.endswith(b'event: message_stop\ndata: {"type":"message_stop"}\n\n')


def test_a_stream_without_usage_counts_the_pieces():
    engine_stream = b"".join(
        line + b"\n\n" for line in stream(["a", "b"]).split(b"\n\n") if b'"usage"' not in line
    )
    events = MessageEvents(MODEL)
    data = translate_stream(events, engine_stream)
    assert b'"usage":{"input_tokens":0,"output_tokens":2}' in data
    assert events.usage is None


# -- what is refused ---------------------------------------------------------------------

CHAT = {"model": MODEL, "max_tokens": 8, "messages": HELLO}


def user_turn(*blocks: dict, **fields) -> dict:
    """CHAT with one user turn of these blocks, and these fields."""
    return {**CHAT, "messages": [{"role": "user", "content": list(blocks)}], **fields}


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({**CHAT, "max_tokens": None}, "max_tokens", "whole number"),
        ({"model": MODEL, "messages": HELLO}, "max_tokens", "required"),
        ({**CHAT, "messages": []}, "messages", "must not be empty"),
        ({**CHAT, "messages": [{"role": "system", "content": "x"}]}, "messages[0].role",
         "user, assistant"),
        (user_turn({"type": "document"}), "messages[0].content[0].type", "/v1/messages itself"),
        (user_turn({"type": "image", "source": {"type": "file", "file_id": "f"}}),
         "messages[0].content[0].source.type", "base64, url"),
        (user_turn({"type": "tool_use", "id": "a", "name": "f", "input": {}}),
         "messages[0].content[0].type", "assistant turn"),
        (user_turn({"type": "thinking", "thinking": "hm"}), "messages", "nothing to answer"),
        ({**CHAT, "tools": [{"type": "web_search_20250305", "name": "web_search"}]},
         "tools[0].type", "server tool"),
        ({**CHAT, "tools": [WEATHER], "tool_choice": {"type": "tool", "name": "nope"}},
         "tool_choice.name", "not in `tools`"),
        ({**CHAT, "system": 5}, "system", "must be an array"),
        ({**CHAT, "temperature": "hot"}, "temperature", "number"),
        ({**CHAT, "temperature": float("nan")}, "temperature", "finite"),
        ({**CHAT, "stream": "yes"}, "stream", "true or false"),
        ([1, 2], "body", "object"),
    ],
    ids=["max-tokens-null", "no-max-tokens", "no-messages", "system-role", "document",
         "file-image", "tool-use-from-user", "only-thinking", "server-tool",
         "unknown-tool-choice", "system-number", "temperature-text", "temperature-nan",
         "stream-text", "not-object"],
)  # fmt: skip
def test_what_cannot_be_translated_is_a_400_naming_the_field(body, param, words):
    with pytest.raises(RouterError) as raised:
        messages.to_chat(body)
    error = raised.value
    assert (error.status, error.param) == (400, param)
    assert f"`{param}" in error.message and words in error.message


@pytest.mark.parametrize(
    ("choice", "wanted"),
    [
        ({"type": "auto"}, "auto"),
        ({"type": "any"}, "required"),
        ({"type": "none"}, "none"),
        ({"type": "tool", "name": "get_weather"}, "required"),
    ],
)
def test_tool_choice(choice, wanted):
    other = {**WEATHER, "name": "get_time"}
    chat = messages.to_chat({**CHAT, "tools": [other, WEATHER], "tool_choice": choice})
    assert chat["tool_choice"] == wanted
    named = choice["type"] == "tool"
    assert [t["function"]["name"] for t in chat["tools"]] == (
        ["get_weather"] if named else ["get_time", "get_weather"]
    )


def test_disabling_parallel_tool_use():
    choice = {"type": "any", "disable_parallel_tool_use": True}
    chat = messages.to_chat({**CHAT, "tools": [WEATHER], "tool_choice": choice})
    assert chat["parallel_tool_calls"] is False


def test_a_final_assistant_turn_is_continued():
    chat = messages.to_chat({**CHAT, "messages": [*HELLO, {"role": "assistant", "content": "Hel"}]})
    assert chat["messages"][-1] == {"role": "assistant", "content": "Hel"}
    assert chat["continue_final_message"] is True and chat["add_generation_prompt"] is False


def test_thinking_is_left_to_the_engine():
    chat = messages.to_chat(
        {
            **CHAT,
            "thinking": {"type": "enabled", "budget_tokens": 1024},
            "messages": [
                *HELLO,
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "hm", "signature": "s"},
                        {"type": "text", "text": "Hello."},
                    ],
                },
                {"role": "user", "content": "Again."},
            ],
        }
    )
    assert "thinking" not in chat
    assert chat["messages"][1] == {"role": "assistant", "content": "Hello."}


def test_structured_output_asks_the_engine_for_json():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    chat = messages.to_chat(
        {**CHAT, "output_config": {"format": {"type": "json_schema", "schema": schema}}}
    )
    assert chat["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "output", "schema": schema},
    }


def test_from_chat_gives_a_valid_message_even_for_an_odd_answer():
    odd = answer("", calls=[tool_call("c", "f", "not json")])
    odd["usage"] = None
    message = Message.model_validate(messages.from_chat(odd, MODEL))
    assert message.content[0].input == {} and message.usage.input_tokens == 0
    with pytest.raises(RouterError) as raised:
        messages.from_chat({"choices": []}, MODEL)
    assert raised.value.status == 502


RICH = {
    "model": MODEL, "max_tokens": 32, "stream": True, "temperature": 0.5, "top_k": 3,
    "system": [{"type": "text", "text": "sys"}], "stop_sequences": ["x"],
    "metadata": {"user_id": "u"}, "tools": [WEATHER],
    "tool_choice": {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
    "output_config": {"format": {"type": "json_schema", "schema": {"type": "object"}}},
    "messages": [
        {"role": "user", "content": [
            {"type": "text", "text": "hi"},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": "AA"}}]},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "t", "signature": "s"},
            {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "x"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t1", "content": [
                {"type": "text", "text": "ok"},
                {"type": "image", "source": {"type": "url", "url": "http://i"}}]},
            {"type": "tool_result", "tool_use_id": "t1", "content": "plain", "is_error": True}]},
    ],
}  # fmt: skip


def test_the_rich_request_translates():
    chat = messages.to_chat(RICH)
    assert [m["role"] for m in chat["messages"]] == ["system", "user", "assistant", "tool", "tool"]
    json.dumps(chat)


@given(body=mutated([RICH, CHAT], tuple(RICH)))
def test_hostile_bodies_give_a_chat_body_or_a_400(body):
    try:
        chat = messages.to_chat(body)
    except RouterError as error:
        assert error.status == 400 and error.param and error.message
    else:
        json.dumps(chat)
        assert chat["messages"] and chat["max_tokens"] >= 1


def _without_ids(data: bytes) -> list[dict]:
    events = sse_events(data)
    events[0]["message"]["id"] = "<id>"
    return events


ENGINE_CHUNKS = stream_chunks(
    stream(["Hi", " there"], calls=[("c1", "f", ['{"a"', ": 1}"])], finish="tool_calls")
)


@given(chunks=mutated([ENGINE_CHUNKS]))
def test_a_hostile_engine_stream_still_gives_the_apis_events(chunks):
    data = translate_stream(
        MessageEvents(MODEL), as_stream(chunks if isinstance(chunks, list) else [])
    )
    for event in sse_events(data):
        if event["type"] != "error":
            EVENTS.validate_python(event)
