"""The official openai SDK, pointed at the router, works as it does against OpenAI."""

from __future__ import annotations

import openai
import pytest

from tests.router.conftest import FULL_KEY

pytestmark = pytest.mark.process


@pytest.fixture
def client(shared):
    return openai.OpenAI(base_url=f"{shared.url}/v1", api_key=FULL_KEY, max_retries=0)


def test_chat(client):
    answer = client.chat.completions.create(model="p", messages=[{"role": "user", "content": "hi"}])
    assert answer.choices[0].message.content == "tok0 tok1 tok2 "
    assert answer.model == "pair"
    assert answer.usage.completion_tokens == 3


def test_streaming_chat(client):
    stream = client.chat.completions.create(
        model="solo", messages=[{"role": "user", "content": "hi"}], stream=True
    )
    pieces = [chunk.choices[0].delta.content for chunk in stream]
    assert pieces == ["tok0 ", "tok1 ", "tok2 "]


def test_streaming_chat_with_usage(client):
    stream = client.chat.completions.create(
        model="solo",
        messages=[{"role": "user", "content": "hi"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 3


def test_completions(client):
    answer = client.completions.create(model="solo", prompt="once upon a time")
    assert answer.choices[0].text == "tok0 tok1 tok2 "


def test_embeddings(client):
    answer = client.embeddings.create(model="solo", input=["a", "b"])
    assert [item.index for item in answer.data] == [0, 1]
    assert answer.usage.prompt_tokens > 0


def test_models(client):
    assert sorted(model.id for model in client.models.list()) == ["pair", "solo"]
    assert client.models.retrieve("s").id == "solo"


def test_errors_become_the_sdks_exceptions(client):
    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model="nope", messages=[])
    assert missing.value.code == "model_not_found"
    with pytest.raises(openai.AuthenticationError):
        client.with_options(api_key="llmgw-wrong").models.list()
