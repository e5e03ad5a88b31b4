"""Commands are obeyed only when signed for this node, unchanged, on time and with an id."""

from __future__ import annotations

import pytest

from protocol.signing import BadSignature, sign, verify

TOKEN = "node01.abc123"
ARGS = ['{"shard_id": "s1"}']
ID = "c0ffee"


def test_a_command_signed_for_this_node_is_obeyed():
    signature = sign(TOKEN, "agent.start_shard", ARGS, 2000.0, ID)
    verify(TOKEN, "agent.start_shard", ARGS, 2000.0, signature, ID, now=1000.0)


@pytest.mark.parametrize(
    ("token", "task", "args", "deadline", "command_id", "now", "reason"),
    [
        ("node02.zzz", "agent.start_shard", ARGS, 2000.0, ID, 1000.0, "not signed for this node"),
        (TOKEN, "agent.stop_shard", ARGS, 2000.0, ID, 1000.0, "not signed for this node"),
        (TOKEN, "agent.start_shard", ['{"shard_id": "s2"}'], 2000.0, ID, 1000.0, "not signed"),
        (TOKEN, "agent.start_shard", ARGS, 2001.0, ID, 1000.0, "not signed for this node"),
        (TOKEN, "agent.start_shard", ARGS, 2000.0, "another", 1000.0, "not signed"),
        (TOKEN, "agent.start_shard", ARGS, 2000.0, ID, 2000.5, "after its deadline"),
    ],
    ids=["other-node", "other-task", "changed-args", "changed-deadline", "changed-id", "late"],
)
def test_a_command_not_signed_for_this_node_or_late_is_refused(
    token, task, args, deadline, command_id, now, reason
):
    signature = sign(TOKEN, "agent.start_shard", ARGS, 2000.0, ID)
    with pytest.raises(BadSignature, match=reason):
        verify(token, task, args, deadline, signature, command_id, now=now)


def test_an_unsigned_command_is_refused():
    with pytest.raises(BadSignature, match="arrived unsigned"):
        verify(TOKEN, "agent.start_shard", ARGS, 2000.0, "", ID, now=1000.0)


def test_a_command_without_an_id_is_refused_however_it_was_signed():
    signature = sign(TOKEN, "agent.start_shard", ARGS, 2000.0, "")
    with pytest.raises(BadSignature, match="carries no command id"):
        verify(TOKEN, "agent.start_shard", ARGS, 2000.0, signature, "", now=1000.0)


def test_an_agent_without_a_token_refuses_everything():
    with pytest.raises(BadSignature, match="has no token"):
        verify("", "agent.start_shard", ARGS, 2000.0, "x", ID, now=1000.0)
