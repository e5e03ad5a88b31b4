"""``llmgw_ctl logs``: the same lines as the logs page, from the same command."""

from __future__ import annotations

import pytest
from django.core.management.base import CommandError

from fleet import commands
from tests.ctl import ctl
from tests.factories import make_node

pytestmark = pytest.mark.django_db


def test_logs_prints_the_lines_the_agent_sends(monkeypatch):
    make_node("node01")
    asked = []

    def read_logs(node_id, source="agent", lines=200):
        asked.append((node_id, source, lines))
        return {"lines": ["first", "second"], "sources": ["agent"]}

    monkeypatch.setattr(commands, "read_logs", read_logs)
    assert ctl("logs", "node01", "--source", "abc", "-n", "5") == "first\nsecond\n"
    assert asked == [("node01", "abc", 5)]
    ctl("logs", "node01")
    assert asked[-1] == ("node01", "agent", 200)


def test_logs_says_when_the_agent_does_not_answer(monkeypatch):
    make_node("node01")

    def silent(node_id, source="agent", lines=200):
        raise commands.AgentDidNotAnswer("the agent on node01 did not answer in 10 s")

    monkeypatch.setattr(commands, "read_logs", silent)
    with pytest.raises(CommandError, match="did not answer in 10 s"):
        ctl("logs", "node01")


def test_logs_names_the_known_nodes_and_sources(monkeypatch):
    make_node("node01")
    with pytest.raises(CommandError, match=r"no node 'node9' \(nodes: node01\)"):
        ctl("logs", "node9")
    monkeypatch.setattr(
        commands, "read_logs", lambda *a, **k: {"lines": [], "sources": ["agent", "s1"]}
    )
    with pytest.raises(CommandError, match="its sources: agent, s1"):
        ctl("logs", "node01", "--source", "nope")
    with pytest.raises(CommandError, match="ask for 1 to 2000 lines"):
        ctl("logs", "node01", "-n", "0")
