"""A command that overtakes the link's answer waits for the key it is signed with."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

from agent_worker import tasks
from protocol.commands import START_SHARD
from protocol.signing import sign

KEY = "node01.abc123"
ARGS = ['{"shard_id": "s1"}']


def agent(monkeypatch, key: str):
    link = SimpleNamespace(command_key=key, refused=[])
    link.send = link.refused.append
    monkeypatch.setattr(tasks, "current", lambda: SimpleNamespace(link=link))
    return link


def test_a_command_before_the_key_is_learned_waits_for_it(monkeypatch):
    link = agent(monkeypatch, "")
    deadline = time.time() + 60
    signature = sign(KEY, START_SHARD, ARGS, deadline=deadline)
    threading.Timer(0.2, lambda: setattr(link, "command_key", KEY)).start()
    assert tasks._checked(START_SHARD, ARGS, deadline, signature)
    assert link.refused == []


def test_a_key_never_learned_still_refuses(monkeypatch):
    monkeypatch.setattr(tasks, "KEY_WAIT", 0.2)
    link = agent(monkeypatch, "")
    deadline = time.time() + 60
    assert not tasks._checked(START_SHARD, ARGS, deadline, sign(KEY, START_SHARD, ARGS, deadline))
    assert "has no token" in link.refused[0].reason
