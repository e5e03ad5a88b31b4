"""An engine that prints its replica's secret never shows it to readers of its logs."""

from __future__ import annotations

import pytest

from audit.actors import AGENT_LINK
from fleet import commands
from fleet.actions.shard_reports import record_shard_status
from fleet.models import Shard
from protocol import messages
from tests.factories import make_node, make_replica, make_shard

pytestmark = pytest.mark.django_db

SECRET = "0123456789abcdef-the-replicas-secret"


def engine_on(node_id: str = "node01") -> Shard:
    node = make_node(node_id)
    return make_shard(make_replica(secret=SECRET), node=node, state="starting")


def test_a_failed_engines_last_lines_are_kept_without_its_secret():
    shard = engine_on()
    tail = [f"args: Namespace(api_key='{SECRET}', port=20000)", "CUDA out of memory"]
    status = messages.ShardStatus(shard_id=shard.id, state="failed", output_tail=tail)

    assert record_shard_status("node01", status, actor=AGENT_LINK)

    shard.refresh_from_db()
    assert shard.output_tail == [
        "args: Namespace(api_key='[replica secret]', port=20000)",
        "CUDA out of memory",
    ]


def test_log_lines_read_from_a_node_are_shown_without_its_engines_secrets(monkeypatch):
    shard = engine_on()
    said = {"lines": [f"--api-key {SECRET}", "loaded"], "sources": ["agent", shard.id]}
    monkeypatch.setattr(commands, "_ask", lambda node_id, command: said)

    answer = commands.read_logs("node01", shard.id, 50)

    assert answer["lines"] == ["--api-key [replica secret]", "loaded"]
    assert commands.read_logs("node01", "agent", 50)["lines"][0] == "--api-key [replica secret]"
