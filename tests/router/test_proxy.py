"""The router as a client sees it: a real router process in front of fake engine processes."""

from __future__ import annotations

import json
import re
import socket

import httpx
import openai
import pytest

from protocol.serving import SERVE_KINDS
from tests.router.conftest import FULL_KEY, LIMITED_KEY, MAX_BODY
from tests.router.harness import free_port, session_homed_on, sse_events, wait_until
from tests.support.metrics import metrics_auth

pytestmark = pytest.mark.process

AUTH = {"Authorization": f"Bearer {FULL_KEY}"}
CHAT = {"messages": [{"role": "user", "content": "hello there"}]}


def post(url: str, body, headers=None, **options) -> httpx.Response:
    return httpx.post(url, json=body, headers={**AUTH, **(headers or {})}, timeout=30, **options)


def next_data(lines) -> str:
    """The next ``data:`` line of a server-sent event stream."""
    for line in lines:
        if line.startswith("data: "):
            return line[len("data: ") :]
    raise AssertionError("the stream ended")


def assert_error(response: httpx.Response, status: int, code: str) -> str:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert set(error) >= {"message", "type", "code"}
    assert error["code"] == code
    return error["message"]


# -- streaming --------------------------------------------------------------------------


def test_stream_chunks_are_relayed_one_by_one_as_the_engine_sends_them(shared):
    engine = shared.engines["C"]
    engine.control(gate=True, chunks=3)
    body = {"model": "solo", "stream": True, **CHAT}
    with httpx.stream(
        "POST", f"{shared.url}/v1/chat/completions", json=body, headers=AUTH, timeout=30
    ) as response:
        assert response.status_code == 200
        assert response.headers["x-accel-buffering"] == "no"
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = response.iter_lines()
        # The engine holds chunk 2 until we have seen chunk 1: a router that buffered or
        # merged chunks would never show us chunk 1, and this would time out.
        for index in range(3):
            chunk = json.loads(next_data(lines))
            assert chunk["choices"][0]["delta"]["content"] == f"tok{index} "
            if index < 2:
                engine.release()
        assert next_data(lines) == "[DONE]"
        rest = list(lines)
        assert [line for line in rest if line] == [], rest  # nothing after [DONE]


def test_a_client_that_did_not_ask_for_usage_gets_no_usage_chunk(shared):
    body = {"model": "solo", "stream": True, **CHAT}
    response = post(f"{shared.url}/v1/chat/completions", body)
    events = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert all(json.loads(e)["choices"] for e in events[:-1])
    (seen,) = shared.engines["C"].requests()
    assert seen["body"]["stream_options"] == {"include_usage": True}  # asked for accounting


def test_a_client_that_asked_for_usage_gets_it(shared):
    body = {"model": "solo", "stream": True, "stream_options": {"include_usage": True}, **CHAT}
    response = post(f"{shared.url}/v1/chat/completions", body)
    events = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
    usage = json.loads(events[-2])
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 3


def test_a_client_leaving_a_stream_cancels_the_engines_request(shared):
    engine = shared.engines["C"]
    engine.control(gate=True, chunks=5)
    body = {"model": "solo", "stream": True, **CHAT}
    with httpx.stream(
        "POST", f"{shared.url}/v1/chat/completions", json=body, headers=AUTH, timeout=30
    ) as response:
        next_data(response.iter_lines())
    # Leaving the block closed our connection without reading the rest.
    wait_until(lambda: engine.requests()[0]["cancelled"], what="the engine to see a cancel")
    assert not engine.requests()[0]["finished"]


def test_a_client_leaving_before_a_whole_answer_cancels_the_engines_request(shared):
    engine = shared.engines["C"]
    engine.control(gate=True, chunks=3)  # the answer waits for two releases that never come
    data = json.dumps({"model": "solo", **CHAT}).encode()
    with socket.create_connection(("127.0.0.1", shared.router.port)) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: router\r\n"
            b"Authorization: Bearer " + FULL_KEY.encode() + b"\r\n"
            b"Content-Type: application/json\r\n"
            b"Content-Length: " + str(len(data)).encode() + b"\r\n\r\n" + data
        )
        wait_until(engine.requests, what="the request to reach the engine")
    wait_until(lambda: engine.requests()[0]["cancelled"], what="the engine to see a cancel")


# -- what passes through, and what changes ---------------------------------------------------


def test_an_alias_reaches_the_engine_as_the_model_name_with_the_engine_secret(shared):
    body = {"model": "s", "temperature": 0.25, "x_extra": [1, {"a": "é"}], **CHAT}
    response = post(f"{shared.url}/v1/chat/completions", body)
    assert response.status_code == 200
    assert response.json()["choices"][0]["message"]["content"] == "tok0 tok1 tok2 "
    (seen,) = shared.engines["C"].requests()
    assert seen["model"] == "solo"
    assert seen["body"] == {**body, "model": "solo"}
    assert seen["authorization"] == "Bearer secret-C"  # never the client's key


def test_a_request_by_the_model_name_reaches_the_engine_unchanged(shared):
    body = {"model": "solo", "prompt": "once upon", "max_tokens": 5}
    response = post(f"{shared.url}/v1/completions", body)
    assert response.status_code == 200
    assert response.json()["object"] == "text_completion"
    assert shared.engines["C"].requests()[0]["body"] == body


def test_a_session_stays_on_one_replica(shared):
    session = {"x-session-id": "conversation-1"}
    answered = {
        post(f"{shared.url}/v1/chat/completions", {"model": "pair", **CHAT}, session).json()[
            "system_fingerprint"
        ]
        for _ in range(6)
    }
    assert len(answered) == 1


def test_requests_without_a_session_are_spread_over_replicas(shared):
    answered = {
        post(f"{shared.url}/v1/chat/completions", {"model": "pair", **CHAT}).json()[
            "system_fingerprint"
        ]
        for _ in range(30)
    }
    assert answered == {"A", "B"}


# -- errors in OpenAI's shape ------------------------------------------------------------


def test_no_key_is_401(shared):
    response = httpx.post(f"{shared.url}/v1/chat/completions", json={"model": "solo"}, timeout=30)
    message = assert_error(response, 401, "missing_api_key")
    assert "llmgw_ctl keys create" in message
    assert response.headers["www-authenticate"] == "Bearer"


@pytest.mark.parametrize("header", ["Bearer llmgw-wrong", "Basic dXNlcjpwdw==", "Bearer"])
def test_a_wrong_key_is_401(shared, header):
    response = httpx.post(
        f"{shared.url}/v1/chat/completions",
        json={"model": "solo"},
        headers={"Authorization": header},
        timeout=30,
    )
    assert response.status_code == 401
    assert response.json()["error"]["code"] in {"invalid_api_key", "missing_api_key"}


def test_a_key_limited_to_other_models_is_403(shared):
    response = post(
        f"{shared.url}/v1/chat/completions",
        {"model": "p", **CHAT},
        {"Authorization": f"Bearer {LIMITED_KEY}"},
    )
    message = assert_error(response, 403, "model_not_allowed")
    assert "'limited' may not use model 'p'; it may use: solo" in message
    ok = post(
        f"{shared.url}/v1/chat/completions",
        {"model": "solo", **CHAT},
        {"Authorization": f"Bearer {LIMITED_KEY}"},
    )
    assert ok.status_code == 200


def test_an_unknown_model_is_404_listing_the_known_ones(shared):
    response = post(f"{shared.url}/v1/chat/completions", {"model": "gpt-5", **CHAT})
    message = assert_error(response, 404, "model_not_found")
    assert "'gpt-5' does not exist; known models: pair, solo" in message


def test_a_body_without_a_model_names_only_the_models_the_key_may_use(shared):
    response = httpx.post(
        f"{shared.url}/v1/chat/completions", content=b'{"messages": []}',
        headers={"Authorization": f"Bearer {LIMITED_KEY}"}, timeout=30,
    )  # fmt: skip
    message = assert_error(response, 400, "missing_model")
    assert "known models: solo." in message and "pair" not in message


@pytest.mark.parametrize(
    ("content", "code", "words"),
    [
        (b'{"model": "solo", ', "invalid_json", "not valid JSON"),
        (b"[1, 2]", "invalid_json", "must be a JSON object"),
        (b'{"messages": []}', "missing_model", "no `model`; known models: pair, solo"),
        (b'{"model": ""}', "missing_model", "no `model`"),
    ],
    ids=["truncated", "not-an-object", "no-model", "empty-model"],
)
def test_a_malformed_body_is_400(shared, content, code, words):
    response = httpx.post(
        f"{shared.url}/v1/chat/completions", content=content, headers=AUTH, timeout=30
    )
    assert words in assert_error(response, 400, code)


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages", "/v1/responses"])
def test_an_image_url_inside_the_fleet_is_400_and_never_reaches_an_engine(shared, path):
    image = "http://169.254.169.254/latest/meta-data/iam/"
    part = {
        "/v1/chat/completions": {"type": "image_url", "image_url": {"url": image}},
        "/v1/messages": {"type": "image", "source": {"type": "url", "url": image}},
        "/v1/responses": {"type": "input_image", "image_url": image},
    }[path]
    conversation = [{"role": "user", "content": [part]}]
    body = {"model": "solo", "max_tokens": 8}
    body["input" if path == "/v1/responses" else "messages"] = conversation

    refused = post(f"{shared.url}{path}", body)

    assert refused.status_code == 400, refused.text
    message = refused.json()["error"]["message"]  # Anthropic's shape on /v1/messages

    assert "169.254.169.254 is a link-local address" in message
    assert "LLMGW_ROUTER_ALLOW_PRIVATE_URLS" in message
    assert shared.engines["C"].requests() == []
    inline = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
    inline_chat = {"model": "solo", "messages": [{"role": "user", "content": [inline]}]}
    answered = post(f"{shared.url}/v1/chat/completions", inline_chat)
    assert answered.status_code == 200, answered.text


def test_a_body_over_the_limit_is_413_whether_its_length_is_declared_or_not(shared):
    big = {"model": "solo", "prompt": "x" * MAX_BODY}
    declared = post(f"{shared.url}/v1/completions", big)
    assert "LLMGW_ROUTER_MAX_BODY" in assert_error(declared, 413, "request_too_large")

    def chunked():
        yield json.dumps(big).encode()

    undeclared = httpx.post(
        f"{shared.url}/v1/completions", content=chunked(), headers=AUTH, timeout=30
    )
    assert_error(undeclared, 413, "request_too_large")
    assert shared.engines["C"].requests() == []


def test_unknown_paths_and_wrong_methods_are_refused_in_the_same_shape(shared):
    assert_error(httpx.get(f"{shared.url}/v2/anything", timeout=30), 404, "not_found")
    wrong = httpx.get(f"{shared.url}/v1/chat/completions", headers=AUTH, timeout=30)
    assert_error(wrong, 405, "method_not_allowed")


# -- listing, health, metrics -------------------------------------------------------------


def test_models_lists_ready_models_with_replica_counts_and_only_what_a_key_may_use(shared):
    listing = httpx.get(f"{shared.url}/v1/models", headers=AUTH, timeout=30).json()
    by_id = {m["id"]: m for m in listing["data"]}
    assert set(by_id) == {"pair", "solo"}
    assert by_id["pair"]["llmgw"] == {
        "aliases": ["p"],
        "serves": list(SERVE_KINDS),  # a static file that does not say: every kind
        "replicas": {"wanted": 2, "ready": 2},
    }
    limited = httpx.get(
        f"{shared.url}/v1/models", headers={"Authorization": f"Bearer {LIMITED_KEY}"}, timeout=30
    ).json()
    assert [m["id"] for m in limited["data"]] == ["solo"]
    assert httpx.get(f"{shared.url}/v1/models", timeout=30).status_code == 401


def test_health_and_metrics(shared):
    post(f"{shared.url}/v1/chat/completions", {"model": "solo", **CHAT})
    health = httpx.get(f"{shared.url}/health", timeout=30).json()
    assert health["status"] == "ok" and health["mode"] == "static"
    assert health["table_source"] == "static" and health["table_age_seconds"] >= 0
    metrics = httpx.get(f"{shared.url}/metrics", headers=metrics_auth(), timeout=30).text
    for name in (
        "llmgw_router_table_from_saved 0.0",
        "llmgw_router_table_age_seconds ",
        'llmgw_router_requests_total{code="200",model="solo"}',
        "llmgw_router_request_seconds_bucket",
        "llmgw_router_time_to_first_byte_seconds_bucket",
        'llmgw_router_inflight{model="solo"',
        "llmgw_router_prompt_tokens_total",
        "llmgw_router_completion_tokens_total",
        "# TYPE llmgw_router_upstream_errors_total counter",
    ):
        assert name in metrics, name


# -- failures: retries and the circuit breaker (each test with its own router) ------------


def own_router(harness, endpoints: list[str], **env: str):
    static = harness.static_file(
        models=[{"name": "m", "endpoints": [{"url": url} for url in endpoints]}], keys=None,
        auth=False,
    )  # fmt: skip
    return harness.router({"LLMGW_ROUTER_STATIC": str(static), **env})


def test_a_5xx_before_the_first_byte_is_retried_on_another_replica(harness):
    a, b = harness.engine("A"), harness.engine("B")
    router = own_router(harness, [a.url, b.url])
    a.control(fail_next=1)
    session = session_homed_on(a.url, [a.url, b.url])
    response = httpx.post(
        f"{router.url}/v1/chat/completions", json={"model": "m", **CHAT},
        headers={"x-session-id": session}, timeout=30,
    )  # fmt: skip
    assert response.status_code == 200
    assert response.json()["system_fingerprint"] == "B"
    assert len(a.requests()) == 1 and len(b.requests()) == 1


def test_a_connect_failure_is_retried_on_another_replica(harness):
    b = harness.engine("B")
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    router = own_router(harness, [dead, b.url])
    session = session_homed_on(dead, [dead, b.url])
    response = httpx.post(
        f"{router.url}/v1/chat/completions", json={"model": "m", **CHAT},
        headers={"x-session-id": session}, timeout=30,
    )  # fmt: skip
    assert response.status_code == 200
    metrics = httpx.get(f"{router.url}/metrics", headers=metrics_auth(), timeout=30).text
    assert f'llmgw_router_upstream_errors_total{{kind="connect",model="m",replica="{dead}"}}' in (
        metrics
    )


def test_retries_stop_after_two_and_the_last_answer_is_the_clients(harness):
    engines = [harness.engine(name) for name in "ABCD"]
    router = own_router(harness, [e.url for e in engines])
    for engine in engines:
        engine.control(fail_next=10, fail_status=503)
    response = httpx.post(
        f"{router.url}/v1/chat/completions", json={"model": "m", **CHAT}, timeout=30
    )
    assert response.status_code == 503
    assert response.json()["error"]["message"] == "engine failure (fake)"
    assert sum(len(e.requests()) for e in engines) == 3


def test_no_replica_answering_at_all_is_502(harness):
    dead = f"http://127.0.0.1:{free_port()}"
    router = own_router(harness, [dead])
    response = httpx.post(
        f"{router.url}/v1/chat/completions", json={"model": "m", **CHAT}, timeout=30
    )
    assert "No replica of m answered" in assert_error(response, 502, "upstream_unreachable")


def test_every_replica_taken_out_is_503_saying_how_many_exist_and_since_when(harness):
    dead = [f"http://127.0.0.1:{free_port()}" for _ in range(2)]
    router = own_router(harness, dead, LLMGW_ROUTER_BREAKER_FAILURES="2",
                        LLMGW_ROUTER_BREAKER_COOLDOWN="3600")  # fmt: skip

    def ask() -> httpx.Response:
        return httpx.post(f"{router.url}/v1/chat/completions", json={"model": "m", **CHAT},
                          timeout=30)  # fmt: skip

    first = ask()  # one failure each: not yet taken out
    assert "No replica of m answered (2 tried)" in assert_error(first, 502, "upstream_unreachable")
    for _ in range(2):  # the second failure each takes both out; then they stay out
        answer = ask()
        message = assert_error(answer, 503, "no_ready_replica")
        assert re.match(r"2 replicas of m exist and none answers: each failed [23] requests in "
                        r"a row and is taken out by the router's breaker", message)  # fmt: skip
        assert re.search(r"none has answered since \d\d:\d\d:\d\d UTC \(\d+ s ago\)", message)
        assert "The last failure: cannot connect to http://127.0.0.1:" in message
        assert int(answer.headers["retry-after"]) > 3000


def assert_stream_error(rest: list[str], words: str) -> None:
    """The stream ended as vLLM and SGLang end theirs on a failure: an error event, [DONE]."""
    *_, error, done = sse_events(rest)
    assert done == "[DONE]"
    assert set(error) == {"error"}
    assert error["error"]["type"] == "upstream_error"
    assert error["error"]["code"] == "upstream_stream_broken"
    assert "broke off its answer" in error["error"]["message"]
    assert words in error["error"]["message"]


@pytest.mark.parametrize(
    "usage", [False, True], ids=["client-asked-no-usage", "client-asked-usage"]
)
def test_an_engine_dying_mid_stream_with_no_other_replica_ends_it_with_an_error_event(
    harness, usage
):
    a = harness.engine("A")
    router = own_router(harness, [a.url])
    a.control(gate=True, chunks=3)
    body = {"model": "m", "stream": True, **CHAT}
    if usage:  # the router drops the usage chunk it asked for only when the client did not
        body["stream_options"] = {"include_usage": True}
    with httpx.stream(
        "POST", f"{router.url}/v1/chat/completions", json=body, timeout=30,
    ) as response:  # fmt: skip
        lines = response.iter_lines()
        next_data(lines)
        a.process.stop()  # the engine dies mid-answer
        rest = list(lines)
    assert_stream_error(rest, "closed the connection mid-answer")
    assert "not carried on elsewhere: no other replica of m is ready" in sse_events(rest)[-2][
        "error"]["message"]  # fmt: skip


def test_an_engine_falling_silent_mid_stream_ends_it_with_an_error_event(harness):
    engine = harness.engine("A")
    router = own_router(harness, [engine.url], LLMGW_ROUTER_READ_TIMEOUT="1")
    engine.control(gate=True, chunks=3)  # sends its first chunk, then waits forever
    with httpx.stream(
        "POST", f"{router.url}/v1/chat/completions",
        json={"model": "m", "stream": True, **CHAT}, timeout=30,
    ) as response:  # fmt: skip
        lines = response.iter_lines()
        next_data(lines)
        rest = list(lines)
    assert_stream_error(rest, "no byte from the engine in 1 s")
    wait_until(lambda: engine.requests()[0]["cancelled"], what="the router to hang up on it")


def test_the_openai_sdk_raises_on_a_stream_cut_midway(harness):
    engine = harness.engine("A")
    router = own_router(harness, [engine.url], LLMGW_ROUTER_READ_TIMEOUT="1")
    engine.control(gate=True, chunks=3)
    client = openai.OpenAI(base_url=f"{router.url}/v1", api_key="unused", max_retries=0)
    stream = client.chat.completions.create(model="m", stream=True, **CHAT)
    assert next(stream).choices[0].delta.content == "tok0 "
    with pytest.raises(openai.APIError, match="broke off its answer"):
        next(stream)


def test_a_replica_failing_repeatedly_is_taken_out(harness):
    a, b = harness.engine("A"), harness.engine("B")
    router = own_router(
        harness, [a.url, b.url],
        LLMGW_ROUTER_BREAKER_FAILURES="2", LLMGW_ROUTER_BREAKER_COOLDOWN="3600",
    )  # fmt: skip
    a.control(fail_next=1000)
    session = {"x-session-id": session_homed_on(a.url, [a.url, b.url])}
    for _ in range(2):
        assert post(f"{router.url}/v1/chat/completions", {"model": "m", **CHAT}, session).is_success
    assert len(a.requests()) == 2
    for _ in range(5):
        assert post(f"{router.url}/v1/chat/completions", {"model": "m", **CHAT}, session).is_success
    assert len(a.requests()) == 2  # taken out: not even tried
    assert len(b.requests()) == 7
    metrics = httpx.get(f"{router.url}/metrics", headers=metrics_auth(), timeout=30).text
    assert f'llmgw_router_breaker_open{{model="m",replica="{a.url}"}} 1.0' in metrics


def test_the_router_runs_under_daphne_too(harness):
    """daphne has no lifespan: the router starts on its first request instead."""
    engine = harness.engine("A", "secret-A")
    static = harness.static_file(
        models=[{"name": "m", "endpoints": [{"url": engine.url, "secret": "secret-A"}]}],
        keys=None, auth=False,
    )  # fmt: skip
    router = harness.router({"LLMGW_ROUTER_STATIC": str(static)}, server="daphne")
    engine.control(gate=True, chunks=3)
    with httpx.stream(
        "POST", f"{router.url}/v1/chat/completions",
        json={"model": "m", "stream": True, **CHAT}, timeout=30,
    ) as response:  # fmt: skip
        lines = response.iter_lines()
        assert json.loads(next_data(lines))["choices"][0]["delta"]["content"] == "tok0 "
        engine.release()
        assert json.loads(next_data(lines))["choices"][0]["delta"]["content"] == "tok1 "
    wait_until(lambda: engine.requests()[0]["cancelled"], what="the engine to see a cancel")


def test_a_router_that_cannot_read_its_table_says_so_instead_of_refusing_keys(harness):
    nowhere = f"postgresql://postgres@127.0.0.1:{free_port()}/nothing"
    router = harness.router({"DATABASE_URL": nowhere, "LLMGW_METRICS_TOKEN": "watcher"})
    health = httpx.get(f"{router.url}/health", timeout=30)
    assert health.status_code == 503
    assert health.json()["status"] == "loading"
    # Why, to the metrics token's holder only: the error names the database's host and user.
    assert "last_error" not in health.json()
    watched = httpx.get(f"{router.url}/health", timeout=30,
                        headers={"Authorization": "Bearer watcher"})  # fmt: skip
    assert "connection" in watched.json()["last_error"].lower()
    response = post(f"{router.url}/v1/chat/completions", {"model": "m", **CHAT})
    assert "not loaded its routing table" in assert_error(
        response, 503, "routing_table_unavailable"
    )
    assert response.headers["retry-after"] == "5"
