"""The agent runtime's own loops, without a control plane."""

from __future__ import annotations

import asyncio
import threading

from agent_worker.config import AgentConfig
from agent_worker.runtime import AgentRuntime
from protocol import messages
from protocol.shard import ShardSpec


def runtime(tmp_path, **fields) -> AgentRuntime:
    config = AgentConfig(
        servers=("ws://127.0.0.1:9",), broker="redis://127.0.0.1:9/0", node_id="node01",
        agent_dir=tmp_path / "agent", weights_dir=tmp_path / "weights", **fields,
    )  # fmt: skip
    return AgentRuntime(config)


def test_a_failed_probe_round_is_logged_and_the_prober_keeps_going(tmp_path, caplog):
    agent = runtime(tmp_path, probe_interval=0.01)
    rounds = []

    async def probe_once() -> None:
        rounds.append(1)
        if len(rounds) == 1:
            raise OSError("the install directory vanished")

    agent._probe_once = probe_once  # type: ignore[method-assign]

    async def scenario() -> None:
        prober = asyncio.create_task(agent._probe_periodically())
        for _ in range(500):
            if len(rounds) >= 3:
                break
            await asyncio.sleep(0.01)
        prober.cancel()

    try:
        asyncio.run(scenario())
    finally:
        agent.stop()
    assert len(rounds) >= 3
    assert "probing engines and weights failed" in caplog.text


def test_weights_changes_are_told_once_when_threads_ask_together(tmp_path):
    agent = runtime(tmp_path)
    agent.weights_held()  # what the register said
    (tmp_path / "weights").mkdir(exist_ok=True)
    (tmp_path / "weights" / "model.gguf").write_bytes(b"GGUF" + bytes(16))
    start = threading.Barrier(8)
    told = []

    def ask() -> None:
        start.wait()
        told.append(agent.weights_changed())

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    agent.stop()
    assert len([message for message in told if message is not None]) == 1


def test_a_draining_agent_refuses_new_shards_and_says_why(tmp_path):
    agent = runtime(tmp_path)
    told = []
    agent.link.send = told.append  # type: ignore[method-assign]
    spec = ShardSpec(shard_id="a" * 32, replica_id="r1", model="m", source="/models/m.gguf",
                     engine="llama.cpp", profile="cpu", port=20000)  # fmt: skip

    agent.drain(True)
    state = agent.start_shard(spec)
    agent.drain(False)

    assert state == "failed"
    [refusal] = [m for m in told if isinstance(m, messages.ShardStatus)]
    assert refusal.reason == "node node01 is draining: it takes no new shards"
    assert agent.start_shard(spec.model_copy(update={"shard_id": "b" * 32})) == "failed"
    assert "draining" not in told[-1].reason  # undrained: refused for another reason


def test_engines_named_in_the_agent_file_are_reported_as_not_managed(tmp_path):
    binary = tmp_path / "opt" / "llama-server"
    binary.parent.mkdir()
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    agent = runtime(tmp_path, engines={"llama.cpp": str(binary)})

    agent.engines.probe()

    [named] = agent.register_message().engines
    assert (named.engine, named.path, named.status, named.managed) == (
        "llama.cpp", str(binary), "installed", False,
    )  # fmt: skip
    assert agent.engines.find("llama.cpp") == str(binary)
    assert agent.engines.find("llama.cpp", "b6000") is None
