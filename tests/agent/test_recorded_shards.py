"""One reader of an agent's shard state files for everything outside the agent: the
benches and the process tests' cleanup read what the agent recorded through it."""

from __future__ import annotations

import re
from pathlib import Path

from agent_worker.supervision.statedir import (
    STATE_DIR_NAME,
    ProcessRecord,
    ShardRecord,
    StateDir,
    recorded_shards,
)
from core.files import TEMPORARY_PREFIX
from protocol.shard import ShardSpec

REPO = Path(__file__).resolve().parents[2]


def spec(shard_id: str) -> ShardSpec:
    return ShardSpec(shard_id=shard_id, replica_id=f"r-{shard_id}", model="m", source="/m.gguf",
                     engine="llama.cpp", port=20000)  # fmt: skip


def process(name: str, pid: int) -> ProcessRecord:
    return ProcessRecord(name=name, pid=pid, pgid=pid, create_time=1.0, cmdline=[name], argv=[name])


def test_the_reader_gives_each_shard_its_record_and_the_process_that_serves(tmp_path):
    state = StateDir(tmp_path / "agent" / STATE_DIR_NAME)
    record = ShardRecord(spec=spec("a"), serves_http=True, commands=2)
    record.processes = [process("rpc-helper", 41), process("llama-server", 42)]
    state.write(record)
    state.write(ShardRecord(spec=spec("b"), serves_http=True, commands=1))

    found = recorded_shards(tmp_path / "agent")

    assert sorted(found) == ["a", "b"]
    assert found["a"].serving.pid == 42  # the last launched is the one serving
    assert [p.pgid for p in found["a"].processes] == [41, 42]
    assert found["b"].serving is None  # written before its launch


def test_files_that_are_not_state_files_are_left_out_and_left_alone(tmp_path):
    state = StateDir(tmp_path / "agent" / STATE_DIR_NAME)
    state.write(ShardRecord(spec=spec("good"), serves_http=True, commands=1))
    corrupt = state.path / "corrupt.json"
    corrupt.write_text("{not json")
    interrupted = state.path / f"{TEMPORARY_PREFIX}good.json"
    interrupted.write_text("{")
    (state.path / "other.json").write_text(
        ShardRecord(spec=spec("good"), serves_http=True, commands=1).model_dump_json()
    )

    assert list(recorded_shards(tmp_path / "agent")) == ["good"]
    assert corrupt.exists() and interrupted.exists()  # the agent's to deal with, not a reader's


def test_an_agent_directory_without_state_reads_as_no_shards_and_is_not_created(tmp_path):
    assert recorded_shards(tmp_path / "agent") == {}
    assert not (tmp_path / "agent").exists()


# The readers there once each parsed shards/*.json in their own way, and drifted.
OUTSIDE_READERS = ["bench/partition_scenarios.py", "bench/fault_system.py",
                   "tests/processes/support.py"]  # fmt: skip
OWN_PARSE = re.compile(r"""/ ["']shards["']|shards/\*\.json|\["processes"\]|\["spec"\]""")


def test_benches_and_process_tests_read_shard_state_through_the_agents_reader():
    for name in OUTSIDE_READERS:
        text = (REPO / name).read_text()
        assert "recorded_shards" in text, f"{name} does not use agent_worker's reader"
        assert not OWN_PARSE.search(text), f"{name} parses the agent's state files itself"
