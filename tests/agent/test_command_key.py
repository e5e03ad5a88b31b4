"""A command that overtakes the link's answer waits for the key it is signed with."""

from __future__ import annotations

import logging
import threading
import time
from types import SimpleNamespace

from agent_worker import tasks
from agent_worker.command_guard import CommandGuard
from protocol.commands import CONVERGE_ENGINES, DRAIN, START_SHARD, STOP_SHARD
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


def test_commands_queued_before_the_key_are_dropped_quietly_with_one_log_line(
    monkeypatch, tmp_path, caplog
):
    # A power-on: the queue holds commands sent before the node went away, some past their
    # deadline; the control plane sends what still stands again once the node links. They
    # are no one's forgery to report: nothing for the node page, one line in the agent log.
    monkeypatch.setattr(tasks, "KEY_WAIT", 0.1)
    link = agent(monkeypatch, tmp_path, "")
    caplog.set_level(logging.INFO, logger="llmgw.agent.commands")
    now = time.time()
    for n, deadline in enumerate((now + 60, now - 30, now + 600, now - 300)):
        args = [f'{{"shard_id": "s{n}"}}']
        signature = sign(KEY, START_SHARD, args, deadline, f"c{n}")
        assert not tasks._checked(START_SHARD, args, deadline, signature, f"c{n}")
    assert link.refused == []
    said = [r for r in caplog.records if r.name == "llmgw.agent.commands"]
    assert len(said) == 1, [r.getMessage() for r in said]
    assert "before this agent learned its command key" in said[0].getMessage()
    assert tasks.current().commands.remembered() == []  # none obeyed: a resend is taken


def test_an_agent_restarted_while_the_control_plane_is_away_reports_no_refusals(
    monkeypatch, tmp_path
):
    # Its queue kept a stop, a drain and the engines' list; it links minutes later. None
    # is refused as "this agent has no token" (an Event each once it links), and once it
    # has its key, a command signed with it is obeyed and a forgery refused as before.
    monkeypatch.setattr(tasks, "KEY_WAIT", 0.1)
    link = agent(monkeypatch, tmp_path, "")
    deadline = time.time() + 600
    for n, (task, args) in enumerate(
        ((STOP_SHARD, ["s1", 3]), (DRAIN, [True]), (CONVERGE_ENGINES, [[]]))
    ):
        signature = sign(KEY, task, args, deadline, f"q{n}")
        assert not tasks._checked(task, args, deadline, signature, f"q{n}")
    assert link.refused == []
    link.command_key = KEY  # linked
    signature = sign(KEY, DRAIN, [True], deadline, "q9")
    assert tasks._checked(DRAIN, [True], deadline, signature, "q9")
    assert not tasks._checked(DRAIN, [True], deadline, "0" * 64, "q10")
    assert [refused.reason for refused in link.refused] == [f"{DRAIN} was not signed for this node"]


def test_an_unsigned_command_is_refused_without_waiting_for_the_key(monkeypatch, tmp_path):
    # Anything that writes to the broker can queue those by the thousand: none may hold one
    # of the agent's four worker threads for the key's wait.
    monkeypatch.setattr(tasks, "KEY_WAIT", 3600)
    link = agent(monkeypatch, tmp_path, "")
    assert not tasks._checked(START_SHARD, ARGS, time.time() + 60, "", ID)
    assert "arrived unsigned" in link.refused[0].reason
