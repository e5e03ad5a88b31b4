"""OpenAI's Responses API served on chat completions, checked with the openai SDK.

Each test sends the SDK's own request through ``to_chat``, answers as llama-server would,
and lets the SDK read the translated answer or stream with its own types and parsers.
"""

from __future__ import annotations

import json

import openai
import pytest
from hypothesis import given
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from router.errors import RouterError, stream_error_event
from router.translate import responses
from router.translate.response_events import ResponseEvents
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
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}
EVENTS = TypeAdapter(ResponseStreamEvent)


def sdk(translated: Translated) -> openai.OpenAI:
    translated.echo = True
    return openai.OpenAI(
        api_key="x", base_url="http://t/v1", max_retries=0, http_client=translated.client()
    )


def events_of(data: bytes) -> list[dict]:
    """The events of a translated stream, each checked against the SDK's own types."""
    events = sse_events(data)
    for event in events:
        EVENTS.validate_python(event)
    return events


# -- requests and answers, through the SDK ------------------------------------------------


def test_a_text_answer_reads_as_a_response():
    translated = Translated(responses, engine_answering(answer("Hello!", prompt=9, completion=2)))
    response = sdk(translated).responses.create(
        model=MODEL, input="Say hello.", instructions="Be brief.", max_output_tokens=32,
        temperature=0.2, top_p=0.9, user="u-1",
    )  # fmt: skip
    assert translated.chats == [
        {
            "model": MODEL,
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Say hello."},
            ],
            "max_tokens": 32,
            "temperature": 0.2,
            "top_p": 0.9,
            "user": "u-1",
        }
    ]
    assert response.output_text == "Hello!"
    assert response.id.startswith("resp_") and response.status == "completed"
    assert response.instructions == "Be brief." and response.max_output_tokens == 32
    usage = response.usage
    assert (usage.input_tokens, usage.output_tokens, usage.total_tokens) == (9, 2, 11)


def test_input_items_keep_their_turns():
    translated = Translated(responses, engine_answering(answer("Paris.")))
    sdk(translated).responses.create(
        model=MODEL,
        input=[
            {"role": "developer", "content": "Answer in one word."},
            {"role": "user", "content": [{"type": "input_text", "text": "Hi."}]},
            {
                "type": "message", "role": "assistant", "status": "completed", "id": "msg_1",
                "content": [{"type": "output_text", "text": "Hello.", "annotations": []}],
            },
            {"role": "user", "content": "A question:"},
            {"role": "user", "content": [
                {"type": "input_text", "text": "What is this?"},
                {"type": "input_image", "image_url": "https://example.com/eiffel.jpg",
                 "detail": "auto"},
            ]},
            {"type": "reasoning", "id": "rs_1", "summary": []},
        ],
    )  # fmt: skip
    assert translated.chats[0]["messages"] == [
        {"role": "system", "content": "Answer in one word."},
        {"role": "user", "content": "Hi."},
        {"role": "assistant", "content": "Hello."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "A question:"},
                {"type": "text", "text": "What is this?"},
                {"type": "image_url", "image_url": {"url": "https://example.com/eiffel.jpg"}},
            ],
        },
    ]


def test_a_function_call_goes_round_trip():
    engine = engine_answering(
        answer(None, calls=[tool_call("call_abc", "get_weather", '{"city":"Oslo"}')],
               finish="tool_calls"),
        answer("It is 3 degrees in Oslo."),
    )  # fmt: skip
    translated = Translated(responses, engine)
    client = sdk(translated)
    first = client.responses.create(model=MODEL, input="Weather in Oslo?", tools=[WEATHER])
    [call] = first.output
    assert (call.type, call.call_id, call.name, call.arguments) == (
        "function_call", "call_abc", "get_weather", '{"city":"Oslo"}'
    )  # fmt: skip
    assert first.tools[0].name == "get_weather"
    assert translated.chats[0]["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": WEATHER["parameters"],
                "description": "The weather in a city.",
            },
        }
    ]
    output = {"type": "function_call_output", "call_id": call.call_id, "output": "3 degrees"}
    asked = {"role": "user", "content": "Weather in Oslo?"}
    second = client.responses.create(
        model=MODEL, tools=[WEATHER], input=[asked, *first.output, output]
    )
    assert second.output_text == "It is 3 degrees in Oslo."
    assert translated.chats[1]["messages"] == [
        {"role": "user", "content": "Weather in Oslo?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_abc",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_abc", "content": "3 degrees"},
    ]


@pytest.mark.parametrize(
    ("choice", "wanted", "names"),
    [
        ("auto", "auto", ["get_time", "get_weather"]),
        ("required", "required", ["get_time", "get_weather"]),
        ("none", "none", ["get_time", "get_weather"]),
        ({"type": "function", "name": "get_weather"}, "required", ["get_weather"]),
        (
            {"type": "allowed_tools", "mode": "auto",
             "tools": [{"type": "function", "name": "get_time"}]},
            "auto", ["get_time"],
        ),
    ],
    ids=["auto", "required", "none", "named", "allowed-tools"],
)  # fmt: skip
def test_tool_choice(choice, wanted, names):
    other = {**WEATHER, "name": "get_time"}
    chat = responses.to_chat({"model": MODEL, "input": "hi", "tools": [other, WEATHER],
                              "tool_choice": choice})  # fmt: skip
    assert chat["tool_choice"] == wanted
    assert [tool["function"]["name"] for tool in chat["tools"]] == names


@pytest.mark.parametrize(
    ("form", "wanted"),
    [
        ({"type": "text"}, None),
        ({"type": "json_object"}, {"type": "json_object"}),
        (
            {"type": "json_schema", "name": "point", "strict": True,
             "schema": {"type": "object", "properties": {"x": {"type": "integer"}}}},
            {"type": "json_schema", "json_schema": {
                "name": "point", "strict": True,
                "schema": {"type": "object", "properties": {"x": {"type": "integer"}}}}},
        ),
    ],
    ids=["text", "json-object", "json-schema"],
)  # fmt: skip
def test_text_format_becomes_response_format(form, wanted):
    chat = responses.to_chat({"model": MODEL, "input": "hi", "text": {"format": form}})
    assert chat.get("response_format") == wanted


def test_an_answer_cut_at_the_token_limit_is_incomplete():
    translated = Translated(responses, engine_answering(answer("Once upon", finish="length")))
    response = sdk(translated).responses.create(model=MODEL, input="A story.",
                                                max_output_tokens=2)  # fmt: skip
    assert response.status == "incomplete"
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.output[0].status == "incomplete" and response.output_text == "Once upon"


def test_an_engine_error_is_openais_error_with_a_string_code():
    body = json.dumps({"error": {"code": 400, "message": "the request exceeds the context size",
                                 "type": "exceed_context_size_error"}}).encode()  # fmt: skip
    translated = Translated(responses, engine_answering((400, body)))
    with pytest.raises(openai.BadRequestError) as raised:
        sdk(translated).responses.create(model=MODEL, input="hi")
    assert raised.value.body == {
        "message": "the request exceeds the context size",
        "type": "exceed_context_size_error",
        "param": None,
        "code": "invalid_request",
    }


@pytest.mark.parametrize(
    ("status", "body", "wanted"),
    [
        (500, b"", {"type": "server_error", "code": "server_error"}),
        (503, b"upstream down", {"type": "server_error", "code": "server_error",
                                 "message": "upstream down"}),
        (404, b'{"detail": "Not Found"}', {"type": "not_found_error", "code": "not_found",
                                           "message": "Not Found"}),
        (429, b'{"error": {"message": "slow down", "type": "rate", "code": "too_many"}}',
         {"type": "rate", "code": "too_many", "message": "slow down"}),
        (400, b'{"error": "bad"}', {"type": "invalid_request_error", "code": "invalid_request",
                                    "message": "bad"}),
    ],
    ids=["empty", "text", "fastapi-detail", "openai-shaped", "bare-string"],
)  # fmt: skip
def test_error_bodies_take_openais_shape(status, body, wanted):
    error = json.loads(responses.error_body(status, body))["error"]
    assert {key: error[key] for key in wanted} == wanted
    assert isinstance(error["message"], str) and error["message"]


# -- streams ------------------------------------------------------------------------------


def test_a_streamed_answer_reads_whole_in_the_sdk():
    engine_stream = stream(["Hel", "lo ", "there!"], prompt=9, completion=3, cached=4)
    translated = Translated(responses, engine_answering(engine_stream), cut=5)
    client = sdk(translated)
    with client.responses.stream(model=MODEL, input="Say hello.") as events:
        deltas = [event.delta for event in events if event.type == "response.output_text.delta"]
        response = events.get_final_response()
    assert deltas == ["Hel", "lo ", "there!"]
    assert translated.chats[0]["stream_options"] == {"include_usage": True}
    assert response.output_text == "Hello there!"
    assert (response.usage.input_tokens, response.usage.output_tokens) == (9, 3)
    assert response.usage.input_tokens_details.cached_tokens == 4
    assert translated.translators[0].usage == Tokens(9, 3, cached=4)


def test_a_streamed_function_call_reads_whole_in_the_sdk():
    engine_stream = stream(["Let me look."], finish="tool_calls", calls=[
        ("call_1", "get_weather", ['{"ci', 'ty": "Os', 'lo"}']),
        ("call_2", "get_weather", ['{"city": "Rome"}']),
    ])  # fmt: skip
    translated = Translated(responses, engine_answering(engine_stream))
    with sdk(translated).responses.stream(model=MODEL, input="hi", tools=[WEATHER]) as events:
        response = events.get_final_response()
    text, oslo, rome = response.output
    assert text.content[0].text == "Let me look."
    assert (oslo.call_id, oslo.name, oslo.arguments) == ("call_1", "get_weather",
                                                         '{"city": "Oslo"}')  # fmt: skip
    assert (rome.call_id, rome.arguments) == ("call_2", '{"city": "Rome"}')


def test_every_event_is_the_apis_own_and_numbered_in_order():
    data = translate_stream(ResponseEvents(MODEL, {"tools": [WEATHER]}), stream(
        ["Hi"], calls=[("c1", "get_weather", ["{}"])], finish="tool_calls"))  # fmt: skip
    events = events_of(data)
    assert [event["sequence_number"] for event in events] == list(range(len(events)))
    assert [event["type"] for event in events] == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.done",
        "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done",
        "response.completed",
    ]  # fmt: skip
    Response.model_validate(events[-1]["response"])


def test_a_stream_cut_at_the_token_limit_ends_incomplete():
    translated = Translated(responses, engine_answering(stream(["Once ", "upon"],
                                                               finish="length")))  # fmt: skip
    events = list(sdk(translated).responses.create(model=MODEL, input="A story.", stream=True))
    last = events[-1]
    assert last.type == "response.incomplete"
    assert last.response.incomplete_details.reason == "max_output_tokens"
    assert last.response.output[0].content[0].text == "Once upon"


def test_an_error_mid_stream_fails_the_response():
    engine_stream = stream(["Partial"], tail=[error_event("the engine ran out of memory"),
                                              b"data: [DONE]\n\n"])  # fmt: skip
    translated = Translated(responses, engine_answering(engine_stream))
    events = list(sdk(translated).responses.create(model=MODEL, input="hi", stream=True))
    failed = events[-1]
    assert failed.type == "response.failed" and failed.response.status == "failed"
    assert failed.response.error.code == "server_error"
    assert failed.response.error.message == "the engine ran out of memory"
    assert failed.response.output[0].content[0].text == "Partial"


def test_the_routers_broken_stream_event_fails_the_response():
    events = ResponseEvents(MODEL)
    before = events.feed(stream(["Partial"], tail=[]))
    after = events.feed(stream_error_event("An engine broke off")) + events.flush()
    parsed = events_of(before + after)
    assert parsed[-1]["type"] == "response.failed"
    assert parsed[-1]["response"]["error"]["message"] == "An engine broke off"
    [error] = events_of(responses.stream_error_event("gone"))
    assert error["type"] == "error" and error["message"] == "gone"


def test_a_stream_cut_anywhere_translates_the_same():
    engine_stream = stream(["ñandú ", "☃ ", "end"], calls=[("c1", "f", ['{"a":', " 1}"])])
    whole = _without_ids(translate_stream(ResponseEvents(MODEL), engine_stream))
    for size in (1, 3, 50):
        assert _without_ids(translate_stream(ResponseEvents(MODEL), engine_stream, size)) == whole


# -- what is refused ---------------------------------------------------------------------

ASK = {"model": MODEL, "input": "hi"}


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({**ASK, "previous_response_id": "resp_1"}, "previous_response_id", "/v1/responses"),
        ({**ASK, "conversation": "conv_1"}, "conversation", "earlier response"),
        ({**ASK, "background": True}, "background", "polled"),
        ({**ASK, "prompt": {"id": "pmpt_1"}}, "prompt", "`instructions`"),
        ({**ASK, "tools": [{"type": "web_search"}]}, "tools[0].type", "'web_search'"),
        ({**ASK, "input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type",
         "stored item"),
        ({**ASK, "input": [{"type": "web_search_call", "id": "ws"}]}, "input[0].type",
         "message, function_call"),
        ({**ASK, "input": [{"role": "user", "content": [{"type": "input_file",
                                                        "file_id": "f"}]}]},
         "input[0].content[0].type", "input_text, input_image"),
        ({**ASK, "input": [{"role": "user", "content": [{"type": "input_image",
                                                        "file_id": "f"}]}]},
         "input[0].content[0].image_url", "file_id"),
        ({**ASK, "input": []}, "input", "must not be empty"),
        ({**ASK, "input": 5}, "input", "must be an array"),
        ({**ASK, "input": [{"type": "reasoning", "summary": []}]}, "input", "nothing to answer"),
        ({**ASK, "tools": [WEATHER], "tool_choice": {"type": "function", "name": "nope"}},
         "tool_choice", "not in `tools`"),
        ({**ASK, "max_output_tokens": 0}, "max_output_tokens", "at least 1"),
        ({**ASK, "text": {"format": {"type": "json_schema"}}}, "text.format.name", "string"),
        ([], "body", "object"),
    ],
    ids=["previous-response", "conversation", "background", "stored-prompt", "hosted-tool",
         "item-reference", "hosted-tool-item", "input-file", "image-file-id", "no-input",
         "input-number", "only-reasoning", "unknown-tool-choice", "zero-tokens",
         "schema-without-name", "not-object"],
)  # fmt: skip
def test_what_cannot_be_translated_is_a_400_naming_the_field(body, param, words):
    with pytest.raises(RouterError) as raised:
        responses.to_chat(body)
    error = raised.value
    assert (error.status, error.param) == (400, param)
    assert f"`{param}" in error.message and words in error.message


def test_from_chat_gives_a_valid_response_even_for_an_odd_answer():
    odd = answer(None, calls=[{"function": {"name": "f", "arguments": {"a": 1}}}])
    odd["usage"] = "none"
    response = Response.model_validate(responses.from_chat(odd, MODEL))
    assert response.output[0].arguments == '{"a": 1}' and response.usage.input_tokens == 0
    with pytest.raises(RouterError) as raised:
        responses.from_chat({"choices": "?"}, MODEL)
    assert raised.value.status == 502


RICH = {
    "model": MODEL, "instructions": "sys", "stream": True, "max_output_tokens": 32,
    "temperature": 0.5, "top_p": 0.5, "parallel_tool_calls": False, "user": "u",
    "tools": [WEATHER],
    "tool_choice": {"type": "allowed_tools", "mode": "required",
                    "tools": [{"type": "function", "name": "get_weather"}]},
    "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}},
    "input": [
        {"role": "developer", "content": "dev"},
        {"role": "user", "content": [{"type": "input_text", "text": "hi"},
                                     {"type": "input_image", "image_url": "data:,AA"}]},
        {"type": "message", "role": "assistant",
         "content": [{"type": "output_text", "text": "ok"}, {"type": "refusal", "refusal": "no"}]},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1",
         "output": [{"type": "input_text", "text": "sunny"}]},
        {"type": "reasoning", "id": "rs", "summary": [], "encrypted_content": "e"},
    ],
}  # fmt: skip


def test_the_rich_request_translates():
    chat = responses.to_chat(RICH)
    assert [m["role"] for m in chat["messages"]] == ["system", "user", "assistant", "tool"]
    assert chat["messages"][2]["content"] == "okno"
    json.dumps(chat)


@given(body=mutated([RICH, ASK], tuple(RICH)))
def test_hostile_bodies_give_a_chat_body_or_a_400(body):
    try:
        chat = responses.to_chat(body)
    except RouterError as error:
        assert error.status == 400 and error.param and error.message
    else:
        json.dumps(chat)
        assert any(message["role"] != "system" for message in chat["messages"])


def _without_ids(data: bytes) -> list[dict]:
    """The events with the ids and times that differ from one translation to the next."""
    text = data.decode()
    for event in events_of(data):
        for item in [event.get("item"), *(event.get("response") or {}).get("output", [])]:
            if item:
                text = text.replace(item["id"], "<id>")
        if "response" in event:
            text = text.replace(event["response"]["id"], "<id>")
    events = events_of(text.encode())
    for event in events:  # made a second apart when a translation straddles one
        if isinstance(event.get("response"), dict):
            event["response"].pop("created_at", None)
    return events


ENGINE_CHUNKS = stream_chunks(
    stream(["Hi", " there"], calls=[("c1", "f", ['{"a"', ": 1}"])], finish="tool_calls")
)


@given(chunks=mutated([ENGINE_CHUNKS]))
def test_a_hostile_engine_stream_still_gives_the_apis_events(chunks):
    data = translate_stream(
        ResponseEvents(MODEL), as_stream(chunks if isinstance(chunks, list) else [])
    )
    for event in sse_events(data):
        if event["type"] != "error":
            EVENTS.validate_python(event)
