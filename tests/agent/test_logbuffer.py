"""The last lines of every source on the node, and the tail that feeds engine logs in."""

from __future__ import annotations

import logging
import threading

import pytest

from agent_worker.logbuffer import AGENT_SOURCE, LogBuffer
from agent_worker.supervision.logtail import MAX_LINE, LogTail


def test_keeps_the_last_2000_lines_per_source():
    buffer = LogBuffer()
    buffer.extend("shard-1", [f"line {i}" for i in range(2500)])
    buffer.append("shard-2", "other")

    kept = buffer.read("shard-1", 5000)
    assert len(kept) == 2000
    assert kept[0] == "line 500" and kept[-1] == "line 2499"
    assert buffer.read("shard-1", 3) == ["line 2497", "line 2498", "line 2499"]
    assert buffer.read("shard-2") == ["other"]


def test_unknown_source_and_zero_lines_read_as_nothing():
    buffer = LogBuffer()
    buffer.append("shard-1", "x")
    assert buffer.read("nobody") == []
    assert buffer.read("shard-1", 0) == []


def test_sources_list_the_agent_first():
    buffer = LogBuffer()
    for source in ("shard-b", AGENT_SOURCE, "shard-a"):
        buffer.append(source, "x")
    assert buffer.sources() == [AGENT_SOURCE, "shard-a", "shard-b"]
    buffer.forget("shard-a")
    assert buffer.sources() == [AGENT_SOURCE, "shard-b"]


def test_the_quietest_source_goes_first_but_never_the_agent():
    buffer = LogBuffer(max_sources=3)
    for source in (AGENT_SOURCE, "old", "busy"):
        buffer.append(source, "x")
    buffer.append("old", "still writing")  # now "busy" is the quietest shard
    buffer.append("new", "x")
    assert buffer.sources() == [AGENT_SOURCE, "new", "old"]


def test_works_as_the_agents_logging_handler():
    buffer = LogBuffer()
    logger = logging.getLogger("test_logbuffer.agent")
    logger.propagate = False
    handler = buffer.handler()
    logger.addHandler(handler)
    try:
        logger.warning("engine %s installed", "llama.cpp")
        try:
            raise RuntimeError("boom")
        except RuntimeError:
            logger.exception("install failed")
        logger.debug("not at INFO")
    finally:
        logger.removeHandler(handler)

    lines = buffer.read(AGENT_SOURCE)
    assert lines[0].endswith("WARNING test_logbuffer.agent: engine llama.cpp installed")
    assert lines[1].endswith("ERROR test_logbuffer.agent: install failed")
    assert lines[2] == "Traceback (most recent call last):"
    assert lines[-1] == "RuntimeError: boom"
    assert not any("not at INFO" in line for line in lines)


def test_threads_appending_together_lose_nothing():
    buffer = LogBuffer(max_lines=10_000)

    def write(source):
        for i in range(1000):
            buffer.append(source, f"{source} {i}")

    threads = [threading.Thread(target=write, args=(f"s{n}",)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(len(buffer.read(f"s{n}", 10_000)) == 1000 for n in range(8))
    assert buffer.read("s3", 1) == ["s3 999"]


@pytest.fixture
def log_file(tmp_path):
    return tmp_path / "shard-1.log"


def test_tail_reads_only_what_was_appended_after_it_started(log_file):
    log_file.write_text("from an earlier run\n")
    buffer = LogBuffer()
    tail = LogTail(log_file, buffer, "shard-1")

    with log_file.open("a") as out:
        out.write("loading model\nhalf a li")
    assert tail.pump() is True
    assert buffer.read("shard-1") == ["loading model"]

    with log_file.open("a") as out:
        out.write("ne\n")
    tail.pump()
    assert buffer.read("shard-1") == ["loading model", "half a line"]
    assert tail.pump() is False


def test_tail_keeps_the_last_state_of_a_redrawn_progress_line(log_file):
    buffer = LogBuffer()
    tail = LogTail(log_file, buffer, "shard-1")
    with log_file.open("ab") as out:
        out.write(b"10%\r50%\r100%\r\nbad byte \xff\n" + b"x" * (MAX_LINE + 10))
    tail.flush()
    lines = buffer.read("shard-1")
    assert lines[:2] == ["100%", "bad byte \ufffd"]
    assert len(lines[2]) == MAX_LINE


def test_tail_starts_over_when_the_file_is_truncated(log_file):
    buffer = LogBuffer()
    tail = LogTail(log_file, buffer, "shard-1")
    log_file.write_text("a long first line\n")
    tail.pump()
    log_file.write_text("new\n")
    tail.pump()
    assert buffer.read("shard-1") == ["a long first line", "new"]


def test_tail_notes_land_in_the_file_and_the_buffer(log_file):
    buffer = LogBuffer()
    tail = LogTail(log_file, buffer, "shard-1")
    tail.note("adopted pid 42")
    tail.pump()
    assert buffer.read("shard-1") == ["[llmgw] adopted pid 42"]
    assert log_file.read_text() == "[llmgw] adopted pid 42\n"
