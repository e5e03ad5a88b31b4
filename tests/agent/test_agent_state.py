"""What an agent remembers across its own restarts: its generation and the newest epoch."""

from __future__ import annotations

from agent_worker.agent_state import AgentState
from agent_worker.supervision.shard import StatusSequence


def test_statuses_of_a_restarted_agent_number_above_the_last_agents(tmp_path):
    path = tmp_path / "agent-state.json"
    first = StatusSequence(AgentState(path).begin_generation())
    sent_before = [first.next() for _ in range(1000)]
    second = StatusSequence(AgentState(path).begin_generation())  # the agent restarted
    assert second.next() > max(sent_before)
    assert path.stat().st_mode & 0o777 == 0o600


def test_a_deposed_leaders_commands_stay_refused_after_an_agent_restart(tmp_path):
    path = tmp_path / "agent-state.json"
    state = AgentState(path)
    assert state.accept_epoch(3) and state.accept_epoch(3)
    assert not state.accept_epoch(2)
    restarted = AgentState(path)
    assert not restarted.accept_epoch(2)
    assert restarted.accept_epoch(4) and restarted.highest_epoch == 4


def test_an_unreadable_state_file_is_reported_and_started_over(tmp_path, caplog):
    path = tmp_path / "agent-state.json"
    path.write_text("{not json")
    state = AgentState(path)
    assert (state.generation, state.highest_epoch) == (0, 0)
    assert "unreadable" in caplog.text
    assert state.begin_generation() == 1
