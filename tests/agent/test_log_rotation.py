"""Log files kept in bounds: copy-and-truncate under a live engine, reads across the set."""

from __future__ import annotations

import os
import signal
import sys
import uuid
from pathlib import Path

import pytest

from agent_worker.config import AgentConfig
from agent_worker.engines.command import LaunchCommand
from agent_worker.logbuffer import LogBuffer
from agent_worker.runtime import AgentRuntime
from agent_worker.supervision.logrotate import last_lines, rotate_if_large, rotated_paths
from agent_worker.supervision.logtail import LogTail
from agent_worker.supervision.process import ShardProcess
from tests.support.polling import wait_until

# Writes a batch of lines, then waits for SIGUSR1 before the next: the test decides when
# the engine writes, so it can rotate between batches without racing it.
BATCH_WRITER = """
import signal, sys
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
batch = 0
while True:
    for i in range(100):
        print(f"batch {batch} line {i:03d} " + "x" * 40)
    print(f"batch {batch} done", flush=True)
    signal.sigwait({signal.SIGUSR1})
    batch += 1
"""


def batch_text(batch: int) -> bytes:
    lines = [f"batch {batch} line {i:03d} " + "x" * 40 for i in range(100)]
    return ("\n".join([*lines, f"batch {batch} done"]) + "\n").encode()


@pytest.fixture
def writer(tmp_path):
    """A batch writer started the way the supervisor starts an engine, and its log."""
    log_path = tmp_path / "shard-1.log"
    tag = f"llmgw-test-{uuid.uuid4().hex}"
    command = LaunchCommand(argv=(sys.executable, "-c", BATCH_WRITER, tag), name="writer")
    proc = ShardProcess.launch(command, log_path)
    yield proc, log_path
    proc.terminate(grace=1.0)


def wait_for_batch(proc: ShardProcess, log_path: Path, batch: int) -> None:
    marker = f"batch {batch} done\n".encode()
    wait_until(lambda: marker in log_path.read_bytes(), what=f"batch {batch} in {log_path}")


@pytest.mark.process
def test_rotation_under_a_live_engine_keeps_old_lines_and_the_engine_writes_from_the_start(
    writer,
):
    proc, log_path = writer
    one, two = log_path.with_name("shard-1.log.1"), log_path.with_name("shard-1.log.2")
    limit = len(batch_text(0)) - 1  # one batch is over the limit

    wait_for_batch(proc, log_path, 0)
    assert rotate_if_large(log_path, limit, count=2) is True
    assert log_path.stat().st_size == 0
    assert one.read_bytes() == batch_text(0)

    os.kill(proc.pid, signal.SIGUSR1)
    wait_for_batch(proc, log_path, 1)
    # The engine's descriptor appends: it writes at the new end, not at its old offset,
    # which would leave a hole of NUL bytes as long as everything rotated away.
    assert log_path.read_bytes() == batch_text(1)

    assert rotate_if_large(log_path, limit, count=2) is True
    os.kill(proc.pid, signal.SIGUSR1)
    wait_for_batch(proc, log_path, 2)
    assert rotate_if_large(log_path, limit, count=2) is True

    assert (one.read_bytes(), two.read_bytes()) == (batch_text(2), batch_text(1))
    assert not log_path.with_name("shard-1.log.3").exists()  # batch 0, the oldest, is gone
    assert rotated_paths(log_path, 2) == [log_path, one, two]


def test_a_file_under_the_limit_or_gone_is_left_alone(tmp_path):
    log_path = tmp_path / "engine.log"
    log_path.write_bytes(b"small\n")
    assert rotate_if_large(log_path, max_bytes=6, count=5) is False
    assert log_path.read_bytes() == b"small\n"
    assert not log_path.with_name("engine.log.1").exists()
    assert rotate_if_large(tmp_path / "vanished.log", max_bytes=1, count=5) is False


def test_a_shorter_count_drops_what_an_older_setting_kept(tmp_path):
    log_path = tmp_path / "engine.log"
    for n in (1, 2, 3):
        log_path.with_name(f"engine.log.{n}").write_text(f"old {n}\n")
    log_path.write_text("current\n")
    assert rotate_if_large(log_path, max_bytes=1, count=1) is True
    assert sorted(p.name for p in tmp_path.iterdir()) == ["engine.log", "engine.log.1"]
    assert log_path.with_name("engine.log.1").read_text() == "current\n"


def test_a_rotated_file_keeps_the_logs_permissions(tmp_path):
    log_path = tmp_path / "engine.log"
    log_path.write_text("may hold a secret\n")
    log_path.chmod(0o600)
    rotate_if_large(log_path, max_bytes=1, count=1)
    assert log_path.with_name("engine.log.1").stat().st_mode & 0o777 == 0o600


@pytest.fixture
def rotated_set(tmp_path):
    """engine.log with two older files, the oldest first: a0..a9, b0..b9, then c0..c2."""
    log_path = tmp_path / "engine.log"
    log_path.with_name("engine.log.2").write_text("".join(f"a{i}\n" for i in range(10)))
    log_path.with_name("engine.log.1").write_text("".join(f"b{i}\n" for i in range(10)))
    log_path.write_text("c0\nc1\nc2\n")
    return log_path


def test_last_lines_come_from_the_current_file_then_the_older_ones(rotated_set):
    assert last_lines(rotated_set, 2, keep=5) == ["c1", "c2"]
    assert last_lines(rotated_set, 5, keep=5) == ["b7", "b8", "b9", "c0", "c1", "c2"][-5:]
    assert last_lines(rotated_set, 15, keep=5) == [
        *(f"a{i}" for i in range(8, 10)),
        *(f"b{i}" for i in range(10)),
        "c0",
        "c1",
        "c2",
    ]
    assert len(last_lines(rotated_set, 1000, keep=5)) == 23
    assert last_lines(rotated_set, 1000, keep=1)[0] == "b0"  # past keep is not read
    assert last_lines(rotated_set, 0, keep=5) == []


def test_a_line_cut_by_the_rotation_reads_whole(tmp_path):
    log_path = tmp_path / "engine.log"
    log_path.with_name("engine.log.1").write_bytes(b"first\nhalf a li")
    log_path.write_bytes(b"ne\nlast without newline")
    assert last_lines(log_path, 2, keep=1) == ["half a line", "last without newline"]
    assert last_lines(tmp_path / "nothing.log", 5, keep=5) == []


def test_a_follower_reads_every_line_once_across_a_rotation(tmp_path):
    log_path = tmp_path / "shard-1.log"
    buffer = LogBuffer()
    tail = LogTail(log_path, buffer, "shard-1")

    def write(text: str) -> None:
        with open(log_path, "ab") as out:
            out.write(text.encode())

    write("one\ntwo\n")
    tail.pump()
    write("three\nfour, not yet read when the file rotates\n")
    assert rotate_if_large(log_path, max_bytes=1, count=3)
    five = "five, longer than everything before it: the file's size cannot tell " * 2
    write(five + "\n")
    tail.flush()
    assert buffer.read("shard-1") == [
        "one",
        "two",
        "three",
        "four, not yet read when the file rotates",
        five,
    ]


def test_a_follower_keeps_its_place_when_the_old_files_are_deleted(tmp_path):
    log_path = tmp_path / "shard-1.log"
    log_path.with_name("shard-1.log.1").write_text("rotated long ago\n")
    buffer = LogBuffer()
    tail = LogTail(log_path, buffer, "shard-1")
    with open(log_path, "ab") as out:
        out.write(b"one\n")
    tail.pump()
    log_path.with_name("shard-1.log.1").unlink()
    with open(log_path, "ab") as out:
        out.write(b"two\n")
    tail.pump()
    assert buffer.read("shard-1") == ["one", "two"]


def test_a_follower_past_the_end_of_a_file_truncated_by_someone_else_starts_over(tmp_path):
    log_path = tmp_path / "shard-1.log"
    buffer = LogBuffer()
    tail = LogTail(log_path, buffer, "shard-1")
    log_path.write_text("a long line before the truncation\n")
    tail.pump()
    os.truncate(log_path, 0)
    with open(log_path, "ab") as out:
        out.write(b"after\n")
    tail.pump()
    assert buffer.read("shard-1") == ["a long line before the truncation", "after"]


def agent(tmp_path, **fields) -> AgentRuntime:
    # Stand-in engines in this checkout's Python: run as the agent's user (conftest).
    fields.setdefault("engine_user", os.environ["LLMGW_AGENT_ENGINE_USER"])
    config = AgentConfig(
        servers=("ws://127.0.0.1:9",), broker="redis://127.0.0.1:9/0", node_id="node01",
        agent_dir=tmp_path / "agent", weights_dir=tmp_path / "weights", **fields,
    )  # fmt: skip
    return AgentRuntime(config)


def test_read_logs_answers_a_shard_from_its_files_across_the_rotation(tmp_path):
    runtime = agent(tmp_path, log_keep=2)
    try:
        log_path = runtime.config.log_dir / "shard-1.log"
        log_path.with_name("shard-1.log.1").write_text("".join(f"old {i}\n" for i in range(5)))
        log_path.write_text("new 0\nnew 1\n")

        assert runtime.read_logs("shard-1", 4) == ["old 3", "old 4", "new 0", "new 1"]
        assert runtime.read_logs("shard-1", 1) == ["new 1"]
        assert runtime.read_logs("../shard-1", 4) == []  # never a path outside the logs
        runtime.logs.append("agent", "the agent's own line")
        assert runtime.read_logs("agent", 1) == ["the agent's own line"]
    finally:
        runtime.stop()


def test_read_logs_of_a_redrawn_progress_line_shows_its_last_state(tmp_path):
    runtime = agent(tmp_path)
    try:
        log_path = runtime.config.log_dir / "shard-1.log"
        log_path.write_bytes(b"10%\r50%\r100%\r\nbad byte \xff\n")
        assert runtime.read_logs("shard-1", 5) == ["100%", "bad byte \ufffd"]
    finally:
        runtime.stop()


@pytest.mark.process
def test_the_supervisor_rotates_its_engines_logs_and_keeps_following_them(harness):
    sup = harness.supervisor()
    spec = harness.spec()
    sup.start(spec, [harness.command(spec.port, "--print-lines", "300")], True, "/health")
    harness.wait_for(spec.shard_id, "ready")
    log_path = harness.root / "logs" / f"{spec.shard_id}.log"

    assert sup.rotate_logs(max_bytes=log_path.stat().st_size + 1, keep=2) == []
    assert sup.rotate_logs(max_bytes=100, keep=2) == [spec.shard_id]

    assert log_path.stat().st_size == 0
    assert b"stub line 299\n" in log_path.with_name(f"{spec.shard_id}.log.1").read_bytes()
    sup.stop(spec.shard_id, grace=3.0)
    lines = sup.logs.read(spec.shard_id)
    assert "stub line 299" in lines and lines[-1] == "[llmgw] stopped: stopped"
    assert last_lines(log_path, 1, keep=2) == ["[llmgw] stopped: stopped"]


def test_the_agent_checks_its_logs_periodically_and_a_failed_round_does_not_end_it(
    tmp_path, caplog
):
    import asyncio

    runtime = agent(tmp_path, log_check_interval=0.01)
    rounds = []

    def rotate_logs() -> list[str]:
        rounds.append(1)
        if len(rounds) == 1:
            raise OSError("the logs directory vanished")
        return []

    runtime.rotate_logs = rotate_logs  # type: ignore[method-assign]

    async def scenario() -> None:
        checker = asyncio.create_task(runtime._rotate_logs_periodically())
        for _ in range(500):
            if len(rounds) >= 3:
                break
            await asyncio.sleep(0.01)
        checker.cancel()

    try:
        asyncio.run(scenario())
    finally:
        runtime.stop()
    assert len(rounds) >= 3
    assert "rotating log files failed" in caplog.text


@pytest.mark.process
def test_the_agents_rotation_round_uses_its_settings(tmp_path, harness):
    runtime = agent(tmp_path, log_max_bytes=1024 * 1024, log_keep=1)
    try:
        spec = harness.spec()
        command = harness.command(spec.port, "--print-lines", "80000")  # over 1 MiB
        runtime.supervisor.start(spec, [command], True, "/health")
        log_path = runtime.config.log_dir / f"{spec.shard_id}.log"
        wait_until(lambda: b"stub engine pid" in log_path.read_bytes(), what="the stub's output")

        assert runtime.rotate_logs() == [spec.shard_id]
        assert runtime.rotate_logs() == []  # the current file is small again
        assert log_path.with_name(f"{spec.shard_id}.log.1").stat().st_size > 1024 * 1024
    finally:
        runtime.stop()
