"""Answers that outlive their engine: a router in this process over stand-in engines that
break off mid-answer (tests/router/standin.py), seen from the client's side."""

from __future__ import annotations

import pytest

from tests.router.standin import PROMPT_TOKENS, TOTAL, Turn, events, start_bench

pytestmark = pytest.mark.asyncio

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
HELLO = {"messages": [{"role": "user", "content": "hello"}]}
WHOLE = "".join(f"w{i} " for i in range(TOTAL))


def text_of(stream: list, path: str = CHAT) -> str:
    pieces = []
    for chunk in stream:
        for choice in chunk.get("choices", []) if isinstance(chunk, dict) else []:
            piece = choice["delta"].get("content") if path == CHAT else choice["text"]
            pieces.append(piece or "")
    return "".join(pieces)


def error_of(stream: list) -> dict:
    *_, error, done = stream
    assert done == "[DONE]"
    assert error["error"]["code"] == "upstream_stream_broken", error
    return error["error"]


# -- the splice -----------------------------------------------------------------------------


@pytest.mark.parametrize("usage", [True, False], ids=["client-asked-usage", "no-usage"])
async def test_a_chat_stream_cut_midway_goes_on_from_another_replica_as_one_answer(tmp_path, usage):
    bench = await start_bench(tmp_path, [Turn(words=3)])
    try:
        body = {**HELLO, "stream": True, "seed": 7, "temperature": 0.3, "max_tokens": 100}
        if usage:
            body["stream_options"] = {"include_usage": True}
        response = await bench.post(CHAT, body)
        metrics = await bench.metrics()
    finally:
        await bench.close()
    assert response.status_code == 200
    stream = events(response.text)
    chunks = [c for c in stream if c != "[DONE]"]
    assert text_of(chunks) == WHOLE  # no word repeated, none lost
    first, second = bench.script.seen
    assert first.engine != second.engine
    assert {c["id"] for c in chunks} == {f"cmpl-{first.engine}"}
    assert {c["created"] for c in chunks} == {chunks[0]["created"]}
    roles = [c for c in chunks if c["choices"] and "role" in c["choices"][0]["delta"]]
    assert len(roles) == 1
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "stop"
    assert stream[-1] == "[DONE]"
    # The continuation: the conversation and the partial answer, the rest of the budget,
    # the client's seed and sampling.
    asked = second.body
    assert asked["messages"] == [*HELLO["messages"], {"role": "assistant", "content": "w0 w1 w2 "}]
    assert asked["continue_final_message"] is True and asked["add_generation_prompt"] is False
    assert asked["max_tokens"] == 97 and asked["seed"] == 7 and asked["temperature"] == 0.3
    # The whole answer's usage: the prompt once, every word the client received.
    whole = {"prompt_tokens": PROMPT_TOKENS, "completion_tokens": TOTAL,
             "total_tokens": PROMPT_TOKENS + TOTAL}  # fmt: skip
    usages = [c["usage"] for c in chunks if c.get("usage")]
    assert usages == ([whole] if usage else [])
    assert f'llmgw_router_prompt_tokens_total{{model="m"}} {PROMPT_TOKENS}.0' in metrics
    assert f'llmgw_router_completion_tokens_total{{model="m"}} {TOTAL}.0' in metrics
    assert 'llmgw_router_migrations_total{model="m",reason="closed"} 1.0' in metrics


async def test_a_completion_stream_goes_on_from_its_prompt_and_text_so_far(tmp_path):
    bench = await start_bench(tmp_path, [Turn(words=5)])
    try:
        body = {"prompt": "Say words:", "stream": True, "max_tokens": 10,
                "stream_options": {"include_usage": True}}  # fmt: skip
        response = await bench.post(COMPLETIONS, body)
    finally:
        await bench.close()
    stream = events(response.text)
    chunks = [c for c in stream if c != "[DONE]"]
    assert text_of(chunks, COMPLETIONS) == "".join(f"w{i} " for i in range(10))
    first, second = bench.script.seen
    assert {c["id"] for c in chunks} == {f"cmpl-{first.engine}"}
    assert second.body["prompt"] == "Say words:w0 w1 w2 w3 w4 "
    assert second.body["max_tokens"] == 5
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["usage"]["completion_tokens"] == 10
    assert chunks[-1]["usage"]["prompt_tokens"] == PROMPT_TOKENS


async def test_an_engine_falling_silent_mid_stream_is_left_for_another(tmp_path):
    bench = await start_bench(tmp_path, [Turn(words=4, how="silent")], read_timeout=0.5)
    try:
        response = await bench.post(CHAT, {**HELLO, "stream": True})
        metrics = await bench.metrics()
    finally:
        await bench.close()
    assert text_of(events(response.text)) == WHOLE
    assert 'llmgw_router_migrations_total{model="m",reason="silent"} 1.0' in metrics


async def test_a_stream_moves_twice_when_its_second_engine_breaks_too(tmp_path):
    bench = await start_bench(tmp_path, [Turn(words=2), Turn(words=3)], engines=3)
    try:
        response = await bench.post(CHAT, {**HELLO, "stream": True})
    finally:
        await bench.close()
    chunks = [c for c in events(response.text) if c != "[DONE]"]
    assert text_of(chunks) == WHOLE
    assert len({seen.engine for seen in bench.script.seen}) == 3
    assert {c["id"] for c in chunks} == {f"cmpl-{bench.script.seen[0].engine}"}
    assert bench.script.seen[2].body["messages"][-1]["content"] == "w0 w1 w2 w3 w4 "


async def test_a_stream_moves_to_a_replica_that_became_ready_after_it_began(tmp_path):
    turn = Turn(words=3)
    bench = await start_bench(tmp_path, [turn])
    every = bench.keep_endpoints(1)  # the request begins with one replica in the table
    turn.on_break = lambda: bench.put_endpoints(every)  # and the second is ready by the cut
    try:
        response = await bench.post(CHAT, {**HELLO, "stream": True})
    finally:
        await bench.close()
    assert text_of(events(response.text)) == WHOLE
    assert [seen.engine for seen in bench.script.seen] == ["A", "B"]


# -- the bounds -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("migrations", "words", "why"),
    [(0, "w0 w1 ", "LLMGW_ROUTER_MIGRATIONS is 0"),
     (1, "w0 w1 w2 w3 ", "moved 1 times already (LLMGW_ROUTER_MIGRATIONS=1)")],
    ids=["none", "one"],
)  # fmt: skip
async def test_moves_stop_at_the_bound_and_the_stream_ends_with_the_error_event(
    tmp_path, migrations, words, why
):
    turns = [Turn(words=2), Turn(words=2), Turn(words=2)]
    bench = await start_bench(tmp_path, turns, engines=3, migrations=migrations)
    try:
        response = await bench.post(CHAT, {**HELLO, "stream": True})
    finally:
        await bench.close()
    stream = events(response.text)
    assert text_of(stream[:-2]) == words
    assert why in error_of(stream)["message"]
    assert len(bench.script.seen) == migrations + 1


async def test_an_answer_at_its_budget_when_cut_ends_with_length_and_no_new_request(tmp_path):
    bench = await start_bench(tmp_path, [Turn(words=3)])
    try:
        response = await bench.post(CHAT, {**HELLO, "stream": True, "max_completion_tokens": 3})
    finally:
        await bench.close()
    stream = events(response.text)
    assert text_of(stream) == "w0 w1 w2 "
    assert stream[-2]["choices"][0]["finish_reason"] == "length"
    assert stream[-1] == "[DONE]"
    assert len(bench.script.seen) == 1


# -- what is not moved ----------------------------------------------------------------------


async def test_a_tool_call_in_flight_is_not_moved(tmp_path):
    bench = await start_bench(tmp_path, [Turn(words=2, tool_call=True)])
    try:
        response = await bench.post(CHAT, {**HELLO, "stream": True})
    finally:
        await bench.close()
    assert "a tool call was in flight" in error_of(events(response.text))["message"]
    assert len(bench.script.seen) == 1


async def test_several_choices_are_not_moved(tmp_path):
    bench = await start_bench(tmp_path, [Turn(words=2)])
    try:
        response = await bench.post(CHAT, {**HELLO, "stream": True, "n": 2})
    finally:
        await bench.close()
    assert "several choices (n > 1)" in error_of(events(response.text))["message"]
    assert len(bench.script.seen) == 1


async def test_an_engine_that_cannot_continue_is_not_asked_to(tmp_path):
    bench = await start_bench(tmp_path, [Turn(words=2)])
    bench.set_engines("sglang")
    try:
        response = await bench.post(CHAT, {**HELLO, "stream": True})
    finally:
        await bench.close()
    message = error_of(events(response.text))["message"]
    assert "broke off its answer after it began" in message
    assert "engine (sglang) cannot continue an answer" in message
    assert len(bench.script.seen) == 1


async def test_engines_that_can_continue_are_asked_to(tmp_path):
    bench = await start_bench(tmp_path, [Turn(words=2)])
    bench.set_engines("llama.cpp")
    try:
        response = await bench.post(CHAT, {**HELLO, "stream": True})
    finally:
        await bench.close()
    assert text_of(events(response.text)) == WHOLE


# -- answers that do not stream -----------------------------------------------------------


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
async def test_an_answer_broken_before_it_reached_the_client_is_asked_again_elsewhere(
    tmp_path, path
):
    bench = await start_bench(tmp_path, [Turn(words=0)])
    body = HELLO if path == CHAT else {"prompt": "Say words:"}
    try:
        response = await bench.post(path, body)
        metrics = await bench.metrics()
    finally:
        await bench.close()
    assert response.status_code == 200
    first, second = bench.script.seen
    assert first.engine != second.engine
    assert second.body == first.body  # from the start: nothing reached the client
    answer = response.json()
    assert answer["system_fingerprint"] == second.engine
    choice = answer["choices"][0]
    assert (choice["message"]["content"] if path == CHAT else choice["text"]) == WHOLE
    assert 'llmgw_router_migrations_total{model="m",reason="closed"} 1.0' in metrics


async def test_an_answer_broken_on_every_replica_is_a_502_after_the_bound(tmp_path):
    bench = await start_bench(tmp_path, [Turn(words=0)] * 3, engines=3, migrations=1)
    try:
        response = await bench.post(CHAT, HELLO)
    finally:
        await bench.close()
    assert response.status_code == 502
    assert "broke off its answer" in response.json()["error"]["message"]
    assert len(bench.script.seen) == 2
