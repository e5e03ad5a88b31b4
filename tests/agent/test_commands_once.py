"""A command is obeyed once: a captured signed command put back on the queue before its
deadline (a replay) is refused, after an agent restart too; and forged commands, however
many, are told to the control plane as a count, not one message each."""

from __future__ import annotations

import time
import uuid
from types import SimpleNamespace

import pytest

from agent_worker import tasks
from agent_worker.command_guard import CommandGuard
from protocol.commands import START_SHARD
from protocol.shard import ShardSpec
from protocol.signing import seal_with_command_key, sign

KEY = "node01.abc123"
SPEC = ShardSpec(shard_id="s1", replica_id="r1", model="m", source="/m.gguf",
                 engine="llama.cpp", port=20000).model_dump_json()  # fmt: skip


class Scheduled:
    """Stands in for the timer that sends what was counted once the minute is over."""

    def __init__(self) -> None:
        self.due: list = []

    def __call__(self, delay: float, send) -> None:
        self.due.append((delay, send))

    def run(self) -> None:
        due, self.due = self.due, []
        for _delay, send in due:
            send()


@pytest.fixture
def agent(monkeypatch, tmp_path):
    """An agent whose runtime starts nothing and whose link keeps what it would send."""
    sent: list = []
    started: list = []
    link = SimpleNamespace(command_key=KEY, send=sent.append, identity=None)
    scheduled = Scheduled()

    def start_shard(spec: ShardSpec) -> str:
        started.append(spec)
        return "starting"

    def runtime(guard: CommandGuard):
        return SimpleNamespace(link=link, commands=guard, start_shard=start_shard)

    def restart() -> SimpleNamespace:
        guard = CommandGuard(tmp_path / "commands-done.json", sent.append, schedule=scheduled)
        made = runtime(guard)
        monkeypatch.setattr(tasks, "current", lambda: made)
        return made

    restart()
    return SimpleNamespace(sent=sent, started=started, restart=restart, scheduled=scheduled)


def signed_start(deadline: float | None = None, command_id: str | None = None) -> dict:
    deadline = deadline or time.time() + 120
    command_id = command_id or uuid.uuid4().hex
    return {"deadline": deadline, "command_id": command_id,
            "signature": sign(KEY, START_SHARD, [SPEC], deadline, command_id)}  # fmt: skip


def test_the_same_signed_start_shard_delivered_twice_starts_once(agent):
    command = signed_start()

    first = tasks.start_shard_task(SPEC, **command)
    again = tasks.start_shard_task(SPEC, **command)  # a Redis reader put it back

    assert (first, again) == ("starting", "refused")
    assert len(agent.started) == 1
    assert "was obeyed already" in agent.sent[0].reason


def test_a_replay_after_the_agent_restarted_is_refused_too(agent):
    command = signed_start()
    tasks.start_shard_task(SPEC, **command)

    agent.restart()  # within the deadline: the id is read back from the agent directory
    assert tasks.start_shard_task(SPEC, **command) == "refused"
    assert tasks.start_shard_task(SPEC, **signed_start()) == "starting"  # a new command
    assert len(agent.started) == 2


def test_an_id_is_forgotten_once_its_deadline_has_passed(tmp_path):
    guard = CommandGuard(tmp_path / "commands-done.json", lambda message: None)
    guard.first_time("old", deadline=1000.0, now=900.0)
    guard.first_time("new", deadline=5000.0, now=900.0)

    guard.first_time("newer", deadline=5000.0, now=2000.0)  # "old" is past its deadline

    restarted = CommandGuard(tmp_path / "commands-done.json", print, clock=lambda: 2000.0)
    assert sorted(restarted.remembered()) == ["new", "newer"]


def test_a_command_without_an_id_is_refused(agent):
    deadline = time.time() + 120
    signature = sign(KEY, START_SHARD, [SPEC], deadline, "")

    assert tasks.start_shard_task(SPEC, deadline=deadline, signature=signature) == "refused"
    assert agent.started == []


def test_a_thousand_forged_commands_are_told_as_a_count_not_one_by_one(agent):
    for index in range(1000):
        forged = signed_start()
        forged["signature"] = "f" * 64 if index % 2 else ""  # altered, or never signed
        assert tasks.start_shard_task(SPEC, **forged) == "refused"

    assert len(agent.sent) <= 2  # the first at once, the rest once the minute is over
    agent.scheduled.run()
    assert len(agent.sent) <= 3
    assert sum(message.count for message in agent.sent) == 1000
    assert agent.started == []


def sealed_start(key: str = KEY) -> tuple[str, dict]:
    """A start whose replica secret is sealed under ``key``, signed for this node."""
    spec = ShardSpec.model_validate_json(SPEC).model_copy(
        update={"sealed_api_key": seal_with_command_key(key, "the-secret", "s1")}
    )
    spec_json = spec.model_dump_json()
    deadline, command_id = time.time() + 120, uuid.uuid4().hex
    signature = sign(KEY, START_SHARD, [spec_json], deadline, command_id)
    return spec_json, {"deadline": deadline, "command_id": command_id, "signature": signature}


def test_a_sealed_secret_is_opened_before_the_shard_starts(agent):
    spec_json, command = sealed_start()
    assert tasks.start_shard_task(spec_json, **command) == "starting"
    [started] = agent.started
    assert (started.api_key, started.sealed_api_key) == ("the-secret", "")


def test_a_secret_sealed_for_another_node_refuses_the_start(agent):
    spec_json, command = sealed_start(key="another node's key")
    assert tasks.start_shard_task(spec_json, **command) == "refused"
    assert agent.started == []
