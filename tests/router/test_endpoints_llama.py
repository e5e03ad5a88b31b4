"""The endpoints clients call, answered by real llama-servers (the SmolLM2 demo model)
through a real router, with the official SDKs: OpenAI's chat, Responses and embeddings,
and Anthropic's Messages, each natively (llama-server serves /v1/responses and
/v1/messages itself) and translated onto chat completions, streamed and not.

One chat engine serves two models of the static table: ``native`` lists the APIs the
engine has, ``translated`` lists none, so the router translates every Messages and
Responses request for it. Answers are short and greedy; nothing here is timed.
"""

from __future__ import annotations

import anthropic
import httpx
import openai
import pytest

from tests.router.harness import Harness, key_sha256, llama_server
from tests.support.llama_servers import LLAMA_BUILDS
from tests.support.metrics import metrics_auth

pytestmark = pytest.mark.process

KEY = "llmgw-test-endpoints-key"
MODELS = ("native", "translated")
ASK = "Say hello."


@pytest.fixture(scope="module", params=LLAMA_BUILDS)
def router_url(tmp_path_factory, request):
    """A router over a chat and an embeddings llama-server, of each build in turn."""
    root = tmp_path_factory.mktemp("endpoints-llama")
    harness = Harness(root)
    try:
        chat = llama_server(harness, root, build=request.param)
        embed = llama_server(
            harness, root, "--embeddings", "--pooling", "mean", build=request.param
        )
        static = harness.static_file(
            models=[
                {"name": "native", "serves": ["chat"],
                 "endpoints": [{"url": chat, "native": ["messages", "responses"]}]},
                {"name": "translated", "serves": ["chat"], "endpoints": [{"url": chat}]},
                {"name": "embed", "serves": ["embeddings"], "endpoints": [{"url": embed}]},
            ],
            keys=[{"name": "sdk", "sha256": key_sha256(KEY)}],
        )  # fmt: skip
        yield harness.router({"LLMGW_ROUTER_STATIC": str(static)}).url
    finally:
        harness.cleanup()


@pytest.fixture
def openai_client(router_url):
    return openai.OpenAI(base_url=f"{router_url}/v1", api_key=KEY, max_retries=0, timeout=120)


@pytest.fixture
def anthropic_client(router_url):
    return anthropic.Anthropic(base_url=router_url, api_key=KEY, max_retries=0, timeout=120)


def tokens_of(router_url: str, model: str) -> tuple[float, float]:
    text = httpx.get(f"{router_url}/metrics", headers=metrics_auth(), timeout=10).text
    counts = []
    for kind in ("prompt", "completion"):
        line = f'llmgw_router_{kind}_tokens_total{{model="{model}"}} '
        found = [row for row in text.splitlines() if row.startswith(line)]
        counts.append(float(found[0].split()[-1]) if found else 0.0)
    return counts[0], counts[1]


@pytest.mark.parametrize("model", MODELS)
def test_responses_answer_whole_and_streamed(openai_client, router_url, model):
    before = tokens_of(router_url, model)
    whole = openai_client.responses.create(model=model, input=ASK, max_output_tokens=12,
                                           temperature=0)  # fmt: skip
    assert whole.status in ("completed", "incomplete")
    assert whole.output_text.strip()
    assert whole.usage.input_tokens > 0 and whole.usage.output_tokens > 0
    # create(stream=True), as the clients call it: the SDK's stream() helper also
    # wants content_index on every delta, which llama-server's own events leave out.
    events = list(openai_client.responses.create(model=model, input=ASK, stream=True,
                                                 max_output_tokens=12, temperature=0))  # fmt: skip
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    final = events[-1]
    assert final.type in ("response.completed", "response.incomplete"), final
    assert deltas and "".join(deltas) == final.response.output_text
    assert final.response.usage.output_tokens > 0
    after = tokens_of(router_url, model)
    assert after[0] > before[0] and after[1] > before[1]  # both charged


@pytest.mark.parametrize("model", MODELS)
def test_messages_answer_whole_and_streamed(anthropic_client, router_url, model):
    before = tokens_of(router_url, model)
    messages = [{"role": "user", "content": ASK}]
    greedy = {"temperature": 0}  # through extra_body: this SDK's create() no longer takes it
    whole = anthropic_client.messages.create(model=model, max_tokens=12, messages=messages,
                                             system="Be brief.", extra_body=greedy)  # fmt: skip
    assert whole.type == "message" and whole.role == "assistant"
    assert whole.content[0].text.strip()
    assert whole.stop_reason in ("end_turn", "max_tokens")
    assert whole.usage.input_tokens > 0 and whole.usage.output_tokens > 0
    with anthropic_client.messages.stream(model=model, max_tokens=12, messages=messages,
                                          extra_body=greedy) as stream:  # fmt: skip
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text and text == final.content[0].text
    assert final.usage.output_tokens > 0
    counted = anthropic_client.messages.count_tokens(model=model, messages=messages)
    # llama-server counts natively; counted through /tokenize (engines without a count of
    # their own, vLLM's /tokenize reading messages), llama-server says no tokens.
    assert counted.input_tokens > 0 if model == "native" else counted.input_tokens >= 0
    after = tokens_of(router_url, model)
    assert after[0] > before[0] and after[1] > before[1]


def test_chat_and_embeddings_through_the_sdk(openai_client, router_url):
    chat = openai_client.chat.completions.create(
        model="native", messages=[{"role": "user", "content": ASK}], max_tokens=8
    )
    assert chat.choices[0].message.content
    vectors = openai_client.embeddings.create(model="embed", input=["one", "two"])
    assert len(vectors.data) == 2 and len(vectors.data[0].embedding) > 16
    assert tokens_of(router_url, "embed")[0] > 0


def test_embeddings_from_a_chat_model_are_refused_without_reaching_it(openai_client):
    with pytest.raises(openai.BadRequestError) as refused:
        openai_client.embeddings.create(model="native", input="one")
    assert refused.value.code == "model_does_not_serve"
    assert "embed" in refused.value.message
