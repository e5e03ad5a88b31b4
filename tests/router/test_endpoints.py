"""Every model-addressed endpoint through a real router process, in front of fake engines:
what each model serves, request ids, CORS, Anthropic's key header, stored responses."""

from __future__ import annotations

import re

import httpx
import pytest

from protocol.serving import KIND_OF_PATH, TOKENIZE_PATHS
from tests.router.conftest import FULL_KEY
from tests.router.harness import Harness, key_sha256
from tests.support.metrics import metrics_auth

pytestmark = pytest.mark.process

AUTH = {"Authorization": f"Bearer {FULL_KEY}"}
# A second key with every model: it may not use the first key's responses.
OTHER_KEY = "llmgw-test-other-key"
OTHER = {"Authorization": f"Bearer {OTHER_KEY}"}
# A key for the chat model alone: it is never told the others' names.
CHAT_ONLY_KEY = "llmgw-test-chat-only-key"
ALLOWED_ORIGIN = "https://app.example"
SERVE_ALL = ["chat", "embeddings", "rerank", "transcription", "speech", "images"]
# A body each endpoint accepts, by path.
BODIES = {
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}]},
    "/v1/completions": {"prompt": "hi"},
    "/v1/responses": {"input": "hi"},
    "/v1/messages": {"max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]},
    "/v1/messages/count_tokens": {"messages": [{"role": "user", "content": "hi"}]},
    "/v1/embeddings": {"input": "hi"},
    "/v1/rerank": {"query": "q", "documents": ["a", "b"]},
    "/rerank": {"query": "q", "documents": ["a", "b"]},
    "/v1/score": {"text_1": "a", "text_2": "b"},
    "/v1/audio/speech": {"input": "hello", "voice": "x"},
    "/v1/images/generations": {"prompt": "a cat"},
    "/tokenize": {"content": "hi"},
    "/detokenize": {"tokens": [1, 2]},
}
UPLOADS = ("/v1/audio/transcriptions", "/v1/audio/translations")
# Bodies the router reads whole are refused past this; an upload streams through.
MAX_BODY = 64 * 1024


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """A router over three engines: one serving chat, one embeddings, one everything."""
    harness = Harness(tmp_path_factory.mktemp("endpoints"))
    try:
        engines = {name: harness.engine(name) for name in ("chat", "embed", "all")}
        static = harness.static_file(
            models=[
                {"name": "chatty", "serves": ["chat"], "endpoints": [{"url": engines["chat"].url,
                                                  "native": ["messages", "responses"]}]},
                {"name": "embedder", "serves": ["embeddings"],
                 "endpoints": [{"url": engines["embed"].url}]},
                {"name": "omni", "serves": SERVE_ALL,
                 "endpoints": [{"url": engines["all"].url, "native": ["messages", "responses"]}]},
            ],
            keys=[{"name": "full", "sha256": key_sha256(FULL_KEY)},
                  {"name": "other", "sha256": key_sha256(OTHER_KEY)},
                  {"name": "chat-only", "sha256": key_sha256(CHAT_ONLY_KEY),
                   "models": ["chatty"]}],
        )  # fmt: skip
        router = harness.router(
            {"LLMGW_ROUTER_STATIC": str(static), "LLMGW_ROUTER_CORS_ORIGINS": ALLOWED_ORIGIN,
             "LLMGW_ROUTER_MAX_BODY": str(MAX_BODY)}
        )  # fmt: skip
        yield router.url, engines
    finally:
        harness.cleanup()


@pytest.fixture
def engines(fleet):
    _url, engines = fleet
    for engine in engines.values():
        engine.reset()
    return engines


@pytest.fixture
def url(fleet):
    return fleet[0]


def upload(
    url: str, path: str, model: str | None = "omni", size: int = 4096, **headers
) -> httpx.Response:
    data = {"model": model} if model else {}
    return httpx.post(
        f"{url}{path}", data=data, files={"file": ("a.wav", b"RIFF" + b"\0" * size)},
        headers={**AUTH, **headers}, timeout=30,
    )  # fmt: skip


@pytest.mark.parametrize("path", sorted(BODIES))
def test_each_endpoint_reaches_a_replica_that_serves_it(url, engines, path):
    response = httpx.post(f"{url}{path}", json={"model": "omni", **BODIES[path]},
                          headers=AUTH, timeout=30)  # fmt: skip
    assert response.status_code == 200, response.text
    seen = engines["all"].requests()
    assert [r["path"] for r in seen] == [path]
    assert seen[0]["model"] == "omni"
    assert seen[0]["request_id"] == response.headers["x-request-id"]


@pytest.mark.parametrize("path", UPLOADS)
def test_uploads_take_the_model_from_the_form_and_reach_the_engine_whole(url, engines, path):
    response = upload(url, path)
    assert response.status_code == 200, response.text
    seen = engines["all"].requests()
    assert [r["path"] for r in seen] == [path]
    assert seen[0]["body"]["upload_bytes"] > 4096
    assert seen[0]["body"]["content_type"].startswith("multipart/form-data; boundary=")


def test_an_upload_streams_through_past_the_body_limit(url, engines):
    response = upload(url, "/v1/audio/transcriptions", size=16 * MAX_BODY)
    assert response.status_code == 200, response.text
    (seen,) = engines["all"].requests()
    assert seen["body"]["upload_bytes"] > 16 * MAX_BODY  # whole, though never held whole


def test_an_upload_naming_its_model_after_a_large_file_is_told_to_send_it_first(url, engines):
    boundary = "b0undary"
    body = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n'
        f"\r\n{'x' * 2 * MAX_BODY}\r\n--{boundary}\r\nContent-Disposition: form-data; "
        f'name="model"\r\n\r\nomni\r\n--{boundary}--\r\n'
    ).encode()
    response = httpx.post(
        f"{url}/v1/audio/transcriptions", content=body, timeout=30,
        headers={**AUTH, "Content-Type": f"multipart/form-data; boundary={boundary}"},
    )  # fmt: skip
    assert response.status_code == 400
    assert "send the `model` field before the file" in response.json()["error"]["message"]
    assert engines["all"].requests() == []


def test_an_upload_without_a_model_field_is_refused_naming_it(url, engines):
    response = upload(url, "/v1/audio/transcriptions", model=None)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "missing_model"
    assert "`model` form field" in response.json()["error"]["message"]
    assert engines["all"].requests() == []


def test_every_model_addressed_path_is_covered_here():
    assert set(BODIES) | set(UPLOADS) == set(KIND_OF_PATH) | set(TOKENIZE_PATHS)


@pytest.mark.parametrize(
    ("model", "path", "kind"),
    [("chatty", "/v1/embeddings", "embeddings"), ("embedder", "/v1/chat/completions", "chat"),
     ("embedder", "/v1/messages", "chat"), ("chatty", "/v1/rerank", "rerank")],
)  # fmt: skip
def test_a_model_asked_for_what_it_does_not_serve_is_refused_before_any_engine(
    url, engines, model, path, kind
):
    response = httpx.post(f"{url}{path}", json={"model": model, **BODIES[path]}, headers=AUTH,
                          timeout=30)  # fmt: skip
    assert response.status_code == 400, response.text
    body = response.json()
    # The Messages API answers in Anthropic's error shape, the rest in OpenAI's.
    error = body["error"]
    message = error["message"]
    assert f"'{model}' serves" in message and f"not {kind}" in message
    assert "omni" in message  # where to go instead
    if path == "/v1/messages":
        assert body["type"] == "error" and error["type"] == "invalid_request_error"
    else:
        assert error["code"] == "model_does_not_serve"
    assert all(engine.requests() == [] for engine in engines.values())


def test_a_refusal_names_only_models_the_key_may_use_instead(url, engines):
    response = httpx.post(
        f"{url}/v1/embeddings",
        json={"model": "chatty", "input": "x"},
        headers={"Authorization": f"Bearer {CHAT_ONLY_KEY}"},
        timeout=30,
    )
    assert response.status_code == 400, response.text
    message = response.json()["error"]["message"]
    assert "no model this key may use serves embeddings" in message
    assert "embedder" not in message and "omni" not in message


def test_models_lists_what_each_serves(url):
    listed = httpx.get(f"{url}/v1/models", headers=AUTH, timeout=10).json()["data"]
    serves = {entry["id"]: entry["llmgw"]["serves"] for entry in listed}
    assert serves == {"chatty": ["chat"], "embedder": ["embeddings"], "omni": SERVE_ALL}


def test_anthropic_clients_key_header_is_accepted(url, engines):
    body = {"model": "chatty", **BODIES["/v1/messages"]}
    response = httpx.post(f"{url}/v1/messages?beta=true", json=body,
                          headers={"x-api-key": FULL_KEY, "anthropic-version": "2023-06-01"},
                          timeout=30)  # fmt: skip
    assert response.status_code == 200, response.text
    assert response.json()["type"] == "message"
    seen = engines["chat"].requests()[0]
    assert seen["query"] == "beta=true"
    assert "llmgw-test" not in seen["authorization"]  # the client's key never reaches engines
    wrong = httpx.post(f"{url}/v1/messages", json=body, headers={"x-api-key": "nope"}, timeout=30)
    assert wrong.status_code == 401
    assert wrong.json()["type"] == "error"


# -- request ids ----------------------------------------------------------------------------


def test_every_answer_has_a_request_id_and_the_engine_gets_it(url, engines):
    answers = [
        httpx.post(f"{url}/v1/chat/completions", json={"model": "chatty", **BODIES[
            "/v1/chat/completions"]}, headers=AUTH, timeout=30),
        httpx.post(f"{url}/v1/chat/completions", json={"model": "nope"}, headers=AUTH, timeout=30),
        httpx.get(f"{url}/v1/models", headers=AUTH, timeout=30),
        httpx.get(f"{url}/health", timeout=30),
        httpx.get(f"{url}/nowhere", timeout=30),
    ]  # fmt: skip
    ids = [answer.headers.get("x-request-id") for answer in answers]
    assert all(re.fullmatch(r"[0-9a-f]{32}", i or "") for i in ids), ids
    assert len(set(ids)) == len(ids)
    assert engines["chat"].requests()[0]["request_id"] == ids[0]


def test_a_clients_own_request_id_is_kept_and_a_strange_one_replaced(url, engines):
    body = {"model": "chatty", **BODIES["/v1/chat/completions"]}
    kept = httpx.post(f"{url}/v1/chat/completions", json=body,
                      headers={**AUTH, "x-request-id": "trace-42"}, timeout=30)  # fmt: skip
    assert kept.headers["x-request-id"] == "trace-42"
    replaced = httpx.post(f"{url}/v1/chat/completions", json=body,
                          headers={**AUTH, "x-request-id": "a b\tc"}, timeout=30)  # fmt: skip
    assert re.fullmatch(r"[0-9a-f]{32}", replaced.headers["x-request-id"])
    assert [r["request_id"] for r in engines["chat"].requests()] == [
        "trace-42",
        replaced.headers["x-request-id"],
    ]


# -- CORS -----------------------------------------------------------------------------------


def test_no_cors_header_for_a_request_without_an_allowed_origin(url):
    body = {"model": "chatty", **BODIES["/v1/chat/completions"]}
    for headers in ({}, {"Origin": "https://elsewhere.example"}):
        response = httpx.post(f"{url}/v1/chat/completions", json=body,
                              headers={**AUTH, **headers}, timeout=30)  # fmt: skip
        assert response.status_code == 200
        assert "access-control-allow-origin" not in response.headers  # not even empty


def test_an_allowed_origin_gets_its_cors_headers_and_its_preflight(url):
    body = {"model": "chatty", **BODIES["/v1/chat/completions"]}
    response = httpx.post(f"{url}/v1/chat/completions", json=body,
                          headers={**AUTH, "Origin": ALLOWED_ORIGIN}, timeout=30)  # fmt: skip
    assert response.headers.get_list("access-control-allow-origin") == [ALLOWED_ORIGIN]
    assert "x-request-id" in response.headers["access-control-expose-headers"]
    preflight = httpx.options(
        f"{url}/v1/chat/completions",
        headers={"Origin": ALLOWED_ORIGIN, "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "authorization, content-type"},
        timeout=30,
    )  # fmt: skip
    assert preflight.status_code == 204
    assert preflight.headers["access-control-allow-origin"] == ALLOWED_ORIGIN
    assert "POST" in preflight.headers["access-control-allow-methods"]
    assert preflight.headers["access-control-allow-headers"] == "authorization, content-type"
    elsewhere = {"Origin": "https://elsewhere.example"}
    refused = httpx.options(f"{url}/v1/chat/completions", headers=elsewhere, timeout=30)
    assert refused.status_code == 403
    assert "LLMGW_ROUTER_CORS_ORIGINS" in refused.json()["error"]["message"]


# -- engine errors ----------------------------------------------------------------------------


def test_an_engines_501_is_the_clients_400_with_a_string_code(url, engines):
    engines["embed"].control(fail_next=1, fail_status=501)
    response = httpx.post(f"{url}/v1/embeddings", json={"model": "embedder", "input": "x"},
                          headers=AUTH, timeout=30)  # fmt: skip
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "not_supported_error"
    assert error["message"] == "engine failure (fake)"


# -- stored responses -------------------------------------------------------------------------


def test_a_response_is_continued_fetched_and_deleted_on_the_replica_that_made_it(url, engines):
    # store: false, so the router keeps nothing of it (router/conversations/) and leaves it
    # to the engine, which may keep its own.
    first = httpx.post(f"{url}/v1/responses", json={"model": "omni", "input": "hi", "store": False},
                       headers=AUTH, timeout=30)  # fmt: skip
    response_id = first.json()["id"]
    follow = {"model": "omni", "input": "more", "previous_response_id": response_id}
    second = httpx.post(f"{url}/v1/responses", json=follow, headers=AUTH, timeout=30)
    assert second.status_code == 200, second.text
    fetched = httpx.get(f"{url}/v1/responses/{response_id}", headers=AUTH, timeout=30)
    assert fetched.status_code == 200 and fetched.json()["id"] == response_id
    deleted = httpx.delete(f"{url}/v1/responses/{response_id}", headers=AUTH, timeout=30)
    assert deleted.status_code == 200
    seen = [(r["method"], r["path"]) for r in engines["all"].requests()]
    assert seen == [
        ("POST", "/v1/responses"), ("POST", "/v1/responses"),
        ("GET", f"/v1/responses/{response_id}"), ("DELETE", f"/v1/responses/{response_id}"),
    ]  # fmt: skip
    gone = httpx.get(f"{url}/v1/responses/{response_id}", headers=AUTH, timeout=30)
    assert gone.status_code == 404 and gone.json()["error"]["code"] == "response_not_found"


def test_a_response_the_engine_keeps_answers_only_the_key_that_made_it(url, engines):
    first = httpx.post(f"{url}/v1/responses", json={"model": "omni", "input": "hi", "store": False},
                       headers=AUTH, timeout=30)  # fmt: skip
    response_id = first.json()["id"]
    follow = {"model": "omni", "input": "more", "previous_response_id": response_id}
    attempts = [
        httpx.get(f"{url}/v1/responses/{response_id}", headers=OTHER, timeout=30),
        httpx.delete(f"{url}/v1/responses/{response_id}", headers=OTHER, timeout=30),
        httpx.post(f"{url}/v1/responses", json=follow, headers=OTHER, timeout=30),
    ]
    for refused in attempts:
        assert refused.status_code == 404, refused.text
        assert refused.json()["error"]["code"] == "response_not_found"
    assert [r["method"] for r in engines["all"].requests()] == ["POST"]  # only the first
    mine = httpx.get(f"{url}/v1/responses/{response_id}", headers=AUTH, timeout=30)
    assert mine.status_code == 200 and mine.json()["id"] == response_id


def test_a_response_the_router_keeps_is_continued_on_any_replica_and_fetched_from_it(url, engines):
    first = httpx.post(f"{url}/v1/responses", json={"model": "omni", "input": "hi"},
                       headers=AUTH, timeout=30)  # fmt: skip
    follow = {"model": "omni", "input": "more", "previous_response_id": first.json()["id"]}
    second = httpx.post(f"{url}/v1/responses", json=follow, headers=AUTH, timeout=30)
    assert second.status_code == 200, second.text
    asked = [r["body"] for r in engines["all"].requests()]
    assert asked[1]["input"] == [
        {"type": "message", "role": "user", "content": "hi"}, *first.json()["output"],
        {"type": "message", "role": "user", "content": "more"},
    ]  # fmt: skip
    assert "previous_response_id" not in asked[1]
    fetched = httpx.get(f"{url}/v1/responses/{second.json()['id']}", headers=AUTH, timeout=30)
    assert fetched.json() == second.json()
    assert len(engines["all"].requests()) == 2  # the engine was not asked for it
    under = httpx.get(f"{url}/v1/responses/{second.json()['id']}/input_items", headers=AUTH,
                      timeout=30)  # fmt: skip
    assert under.status_code == 404 and "not of /input_items" in under.json()["error"]["message"]


def test_an_unknown_previous_response_is_refused_with_the_reason(url, engines):
    follow = {"model": "omni", "input": "more", "previous_response_id": "resp_never"}
    response = httpx.post(f"{url}/v1/responses", json=follow, headers=AUTH, timeout=30)
    assert response.status_code == 404
    error = response.json()["error"]
    assert error["code"] == "response_not_found" and "resp_never" in error["message"]
    assert engines["all"].requests() == []


def test_usage_of_each_shape_is_counted(url, engines):
    def tokens() -> dict[str, float]:
        text = httpx.get(f"{url}/metrics", headers=metrics_auth(), timeout=10).text
        found = re.findall(
            r'llmgw_router_(prompt|completion)_tokens_total\{model="omni"\} ([0-9.e+]+)', text
        )
        return {kind: float(value) for kind, value in found}

    before = tokens()
    for path in ("/v1/responses", "/v1/messages"):
        httpx.post(f"{url}{path}", json={"model": "omni", **BODIES[path]}, headers=AUTH,
                   timeout=30).raise_for_status()  # fmt: skip
    after = tokens()
    # Responses: 7 in, 3 out; Messages: 5 in, 2 out (the fake engine's answers).
    assert after.get("prompt", 0) - before.get("prompt", 0) == 12
    assert after.get("completion", 0) - before.get("completion", 0) == 5
