"""Responses chains with the OpenAI SDK, through a real router, to a real llama-server (the
SmolLM2 demo model), which keeps no responses and refuses ``previous_response_id``: the
router keeps each conversation and puts it into the next request's input, natively
(llama-server's own /v1/responses) and translated onto chat completions.

The model is tiny: what is checked is what the engine was asked (a recording
pass-through sits in front of it), not whether the model remembered anything.
"""

from __future__ import annotations

from typing import Any

import openai
import pytest

from tests.router.harness import Harness, key_sha256, llama_server

pytestmark = pytest.mark.process

KEY = "llmgw-test-chains-key"
OTHER_KEY = "llmgw-test-chains-other-key"
SHORT = {"max_output_tokens": 8, "temperature": 0}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    root = tmp_path_factory.mktemp("chains-llama")
    harness = Harness(root)
    try:
        engine = harness.recorder("llama", llama_server(harness, root))
        static = harness.static_file(
            models=[
                {"name": "native", "serves": ["chat"],
                 "endpoints": [{"url": engine.url, "native": ["messages", "responses"]}]},
                {"name": "translated", "serves": ["chat"], "endpoints": [{"url": engine.url}]},
            ],
            keys=[{"name": "sdk", "sha256": key_sha256(KEY)},
                  {"name": "other", "sha256": key_sha256(OTHER_KEY)}],
        )  # fmt: skip
        router = harness.router({"LLMGW_ROUTER_STATIC": str(static)})
        yield router.url, engine
    finally:
        harness.cleanup()


def client(url: str, key: str = KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=120)


def texts(value: Any) -> str:
    """Every string in a request body, one a line: what the engine was given to read."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        return "\n".join(texts(v) for v in value.values())
    if isinstance(value, list):
        return "\n".join(texts(v) for v in value)
    return ""


@pytest.mark.parametrize(
    ("model", "engine_path"), [("native", "/v1/responses"), ("translated", "/v1/chat/completions")]
)
def test_a_three_turn_chain_reaches_the_engine_whole(fleet, model, engine_path):
    url, engine = fleet
    engine.reset()
    sdk = client(url)
    first = sdk.responses.create(model=model, input="My name is Zorblax.", **SHORT)
    second = sdk.responses.create(model=model, input="What colour is the sky?",
                                  previous_response_id=first.id, **SHORT)  # fmt: skip
    # Streamed (not through responses.stream(), whose accumulator wants the content_index
    # llama-server's deltas lack): the last event holds the response.
    events = list(
        sdk.responses.create(
            model=model,
            input="What is my name?",
            previous_response_id=second.id,
            stream=True,
            **SHORT,
        )
    )
    assert events[-1].type in ("response.completed", "response.incomplete")  # (its length)
    third = events[-1].response

    asked = [r for r in engine.requests() if r["method"] == "POST"]
    assert [r["path"] for r in asked] == [engine_path] * 3
    third_asked = asked[2]["body"]
    assert "previous_response_id" not in third_asked
    read = texts(third_asked)
    for said in ("My name is Zorblax.", first.output_text, "What colour is the sky?",
                 second.output_text, "What is my name?"):  # fmt: skip
        assert said in read
    assert read.index("Zorblax") < read.index("What colour") < read.index("What is my name?")

    # The streamed answer was kept too: a fourth turn continues from it.
    sdk.responses.create(model=model, input="Thanks.", previous_response_id=third.id, **SHORT)
    fourth_read = texts(engine.requests()[-1]["body"])
    assert "My name is Zorblax." in fourth_read and third.output_text in fourth_read


def test_a_kept_response_is_fetched_and_deleted_only_by_its_key(fleet):
    url, _engine = fleet
    sdk, other = client(url), client(url, OTHER_KEY)
    first = sdk.responses.create(model="native", input="My name is Zorblax.", **SHORT)

    fetched = sdk.responses.retrieve(first.id)
    assert (fetched.id, fetched.output_text) == (first.id, first.output_text)
    with pytest.raises(openai.NotFoundError, match="not known to this router"):
        other.responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError, match="not known to this router"):
        other.responses.create(model="native", input="What is my name?",
                               previous_response_id=first.id, **SHORT)  # fmt: skip
    with pytest.raises(openai.NotFoundError):
        other.responses.delete(first.id)

    sdk.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        sdk.responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError):
        sdk.responses.create(model="native", input="What is my name?",
                             previous_response_id=first.id, **SHORT)  # fmt: skip
