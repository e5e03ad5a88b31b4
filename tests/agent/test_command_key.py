"""A command that overtakes the link's answer waits for the key it is signed with."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

from agent_worker import tasks
from agent_worker.command_guard import CommandGuard
from protocol.commands import START_SHARD
from protocol.signing import sign

KEY = "node01.abc123"
ARGS = ['{"shard_id": "s1"}']
ID = "c0ffee"


def agent(monkeypatch, tmp_path, key: str):
    link = SimpleNamespace(command_key=key, refused=[])
    link.send = link.refused.append
    guard = CommandGuard(tmp_path / "commands-done.json", link.send)
    monkeypatch.setattr(tasks, "current", lambda: SimpleNamespace(link=link, commands=guard))
    return link


def test_a_command_before_the_key_is_learned_waits_for_it(monkeypatch, tmp_path):
    link = agent(monkeypatch, tmp_path, "")
    deadline = time.time() + 60
    signature = sign(KEY, START_SHARD, ARGS, deadline, ID)
    timer = threading.Timer(0.2, lambda: setattr(link, "command_key", KEY))
    timer.start()
    assert tasks._checked(START_SHARD, ARGS, deadline, signature, ID)
    timer.join()
    assert link.refused == []


def test_a_key_never_learned_still_refuses(monkeypatch, tmp_path):
    monkeypatch.setattr(tasks, "KEY_WAIT", 0.2)
    link = agent(monkeypatch, tmp_path, "")
    deadline = time.time() + 60
    signature = sign(KEY, START_SHARD, ARGS, deadline, ID)
    assert not tasks._checked(START_SHARD, ARGS, deadline, signature, ID)
    assert "has no token" in link.refused[0].reason


def test_an_unsigned_command_is_refused_without_waiting_for_the_key(monkeypatch, tmp_path):
    # Anything that writes to the broker can queue those by the thousand: none may hold one
    # of the agent's four worker threads for the key's wait.
    monkeypatch.setattr(tasks, "KEY_WAIT", 3600)
    link = agent(monkeypatch, tmp_path, "")
    assert not tasks._checked(START_SHARD, ARGS, time.time() + 60, "", ID)
    assert "arrived unsigned" in link.refused[0].reason
