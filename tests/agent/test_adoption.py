"""A new agent takes over the engines the last one left running, and only those."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import psutil
import pytest
from stub_engine import PATIENCE, STUB, gone

from agent_worker.supervision.health import port_open
from agent_worker.supervision.process import ShardProcess, identify
from agent_worker.supervision.statedir import ProcessRecord, ShardRecord, StateDir
from tests.support.polling import wait_until
from tests.support.ports import free_port


def left_running(harness, *flags, serves_http=True):
    """Start a shard with one supervisor, then drop that supervisor as kill -9 would."""
    first = harness.supervisor()
    spec = harness.spec()
    first.start(spec, [harness.command(spec.port, *flags)], serves_http, "/health")
    wait_until(lambda: first.running() and first.running()[0].pid, what="the engine to start")
    pid = first.running()[0].pid
    first.shutdown()  # stops watching; the engine keeps running
    harness.transitions.clear()
    return spec, pid


def stray_process(harness):
    """A real process no supervisor started, in a session of its own."""
    return subprocess.Popen(
        [sys.executable, str(STUB), "--port", str(free_port()), "--tag", harness.tag],
        start_new_session=True,
        stdout=subprocess.DEVNULL,
    )


def write_record(harness, spec, processes, **fields):
    record = ShardRecord(spec=spec, serves_http=True, commands=len(processes) or 1, **fields)
    record.processes = processes
    StateDir(harness.root / "state").write(record)
    return harness.root / "state" / f"{spec.shard_id}.json"


def describe(proc, **changes):
    handle = psutil.Process(proc.pid)
    fields = {
        "name": "engine",
        "pid": proc.pid,
        "pgid": proc.pid,
        "create_time": handle.create_time(),
        "cmdline": handle.cmdline(),
        "argv": handle.cmdline(),
    }
    return ProcessRecord(**{**fields, **changes})


@pytest.mark.process
def test_new_agent_adopts_the_running_engine_and_can_stop_it(harness):
    spec, pid = left_running(harness, "--ready-after", "1")
    second = harness.supervisor()

    adopted = second.adopt_all()

    assert [(s.spec, s.state, s.pid, s.adopted) for s in adopted] == [(spec, "starting", pid, True)]
    ready = harness.wait_for(spec.shard_id, "ready")
    assert ready.pid == pid
    assert harness.states(spec.shard_id) == ["starting", "ready"]
    assert "after an agent restart" in harness.transitions[0].reason
    assert second.pids() == {spec.shard_id: pid}
    log_file = harness.root / "logs" / f"{spec.shard_id}.log"
    notes = "\n".join(second.logs.read(spec.shard_id))
    assert f"adopted pid {pid}; earlier output is in {log_file}" in notes

    second.stop(spec.shard_id, grace=10)

    assert harness.transitions[-1].state == "stopped"
    assert gone(pid)
    assert not (harness.root / "state" / f"{spec.shard_id}.json").exists()


@pytest.mark.process
def test_an_adopted_engine_that_answers_at_once_is_ready_without_going_back_to_starting(harness):
    # A ready engine reported as starting takes its replica out of every router until the
    # next health check: an agent restart would be an outage of every model it serves.
    first = harness.supervisor()
    spec = harness.spec()
    first.start(spec, [harness.command(spec.port)], True, "/health")
    pid = harness.wait_for(spec.shard_id, "ready").pid
    first.shutdown()
    harness.transitions.clear()
    second = harness.supervisor()

    adopted = second.adopt_all()

    assert [(s.state, s.pid, s.adopted) for s in adopted] == [("ready", pid, True)]
    assert harness.states(spec.shard_id) == ["ready"]
    reason = harness.transitions[0].reason
    assert f"adopted pid {pid} after an agent restart" in reason and "200" in reason


@pytest.mark.process
def test_an_adopted_worker_rank_alive_long_enough_is_ready_at_once(harness):
    spec, pid = left_running(harness, serves_http=False)
    # Younger than an hour's settle time: its staying alive must decide.
    young = harness.supervisor(settle=3600.0)
    assert [s.state for s in young.adopt_all()] == ["starting"]
    young.shutdown()
    harness.transitions.clear()
    second = harness.supervisor(settle=0.0)

    adopted = second.adopt_all()

    assert [(s.state, s.pid) for s in adopted] == [("ready", pid)]
    assert harness.states(spec.shard_id) == ["ready"]


@pytest.mark.process
def test_redelivered_start_after_a_restart_is_answered_by_the_adopted_engine(harness):
    spec, pid = left_running(harness)
    second = harness.supervisor()

    state = second.start(spec, [harness.command(spec.port)], True, "/health")

    assert state in ("starting", "ready")  # its health check may already have answered
    assert [s.pid for s in second.running()] == [pid]
    assert len(harness.tagged_pids()) == 1


@pytest.mark.process
def test_adopted_engine_that_never_answers_is_left_for_the_control_plane(harness):
    spec, pid = left_running(harness, "--ready-after", "9999")
    second = harness.supervisor()
    second.adopt_all()

    wait_until(lambda: "503" in second.running()[0].detail, what="a 503 from the engine")

    assert second.running()[0].state == "starting"
    assert not gone(pid)
    assert "failed" not in harness.states(spec.shard_id)


@pytest.mark.process
def test_hung_engines_hold_adoption_up_for_one_bounded_wait_not_one_each(harness):
    # The register waits on adoption, and a node 15 s without one is unreachable: wedged
    # engines are checked together, and adoption gives up on them in a bounded time
    # however long their sockets hang; their health checks go on as for any shard.
    first = harness.supervisor()
    specs = [harness.spec(f"hung-{n}") for n in range(3)]
    for spec in specs:
        first.start(spec, [harness.command(spec.port, "--hang")], True, "/health")
    wait_until(lambda: all(port_open(s.host, s.port) for s in specs), what="engines to listen")
    first.shutdown()
    harness.transitions.clear()
    second = harness.supervisor(health_timeout=600.0)
    adopted = []
    adopting = threading.Thread(target=lambda: adopted.extend(second.adopt_all()), daemon=True)

    adopting.start()
    adopting.join(PATIENCE)

    assert not adopting.is_alive(), "adoption waited out the hung engines' health checks"
    assert sorted((s.spec.shard_id, s.state) for s in adopted) == [
        ("hung-0", "starting"), ("hung-1", "starting"), ("hung-2", "starting")
    ]  # fmt: skip
    assert harness.states("hung-0") == ["starting"]


@pytest.mark.process
def test_adopted_worker_rank_is_ready_by_staying_alive(harness):
    spec, pid = left_running(harness, "--ready-after", "9999", serves_http=False)
    second = harness.supervisor(settle=1.0)
    second.adopt_all()

    assert "alive" in harness.wait_for(spec.shard_id, "ready").reason


@pytest.mark.process
def test_adopted_engine_that_dies_is_reported_failed(harness):
    spec, pid = left_running(harness, "--print-lines", "3")
    second = harness.supervisor()
    second.adopt_all()
    harness.wait_for(spec.shard_id, "ready")

    os.kill(pid, signal.SIGKILL)

    failed = harness.wait_for(spec.shard_id, "failed")
    assert f"engine (pid {pid}) exited" in failed.reason
    assert "exit code is unknown" in failed.reason
    assert second.running() == []


@pytest.mark.process
@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"cmdline": ["/usr/bin/llama-server", "--port", "1"]}, "command line differs"),
        ({"argv": ["/usr/bin/llama-server"], "create_time": 1.0}, "start time differs"),
    ],
)
def test_a_pid_now_held_by_another_process_is_not_adopted(harness, change, said):
    stray = stray_process(harness)
    try:
        wait_until(lambda: stray.pid in harness.tagged_pids(), what="the stray process")
        spec = harness.spec()
        change.setdefault("argv", change.get("cmdline", ["/usr/bin/llama-server"]))
        state_file = write_record(harness, spec, [describe(stray, **change)])
        sup = harness.supervisor()

        assert sup.adopt_all() == []

        [failed] = harness.transitions
        assert failed.state == "failed" and said in failed.reason
        assert not state_file.exists()
        assert stray.poll() is None  # not ours to kill
    finally:
        stray.kill()
        stray.wait(timeout=30)


@pytest.mark.process
def test_a_shard_whose_processes_are_gone_is_reported_once_and_forgotten(harness):
    stray = stray_process(harness)
    wait_until(lambda: stray.pid in harness.tagged_pids(), what="the stray process")
    spec = harness.spec()
    state_file = write_record(harness, spec, [describe(stray)])
    stray.kill()
    stray.wait(timeout=30)

    assert harness.supervisor().adopt_all() == []
    assert harness.supervisor().adopt_all() == []

    [failed] = harness.transitions
    assert failed.state == "failed" and "is gone" in failed.reason
    assert failed.replica_id == spec.replica_id
    assert not state_file.exists()


@pytest.mark.process
def test_a_stop_the_previous_agent_began_is_finished(harness):
    spec, pid = left_running(harness)
    path = harness.root / "state" / f"{spec.shard_id}.json"
    record = ShardRecord.model_validate_json(path.read_bytes())
    record.stopping = True
    StateDir(harness.root / "state").write(record)
    sup = harness.supervisor()

    assert sup.adopt_all() == []

    assert harness.wait_for(spec.shard_id, "stopped").pid == pid
    wait_until(lambda: gone(pid), what="the engine to be stopped")
    assert not path.exists()


def test_a_corrupt_state_file_is_reported_and_kept(harness):
    state = harness.root / "state"
    state.mkdir(parents=True)
    (state / "shard-9.json").write_text('{"spec": {"shard_id": "shard-9"')
    (state / "bad name.json").write_text("{}")
    sup = harness.supervisor(background=False)

    assert sup.adopt_all() == []

    assert len(sup.problems) == 2
    assert any(str(state / "shard-9.json") in p and "not readable" in p for p in sup.problems)
    assert any("unsafe name" in p for p in sup.problems)
    assert (state / "shard-9.json").exists() and (state / "bad name.json").exists()
    assert harness.transitions == []
    sup.adopt_all()
    assert len(sup.problems) == 2  # reported once, not once per call


def test_a_start_over_an_unreadable_state_file_is_refused_and_the_file_kept(harness):
    state = harness.root / "state"
    state.mkdir(parents=True)
    (state / "shard-1.json").write_text("not json")
    sup = harness.supervisor(background=False)
    spec = harness.spec(shard_id="shard-1")

    assert sup.start(spec, [harness.command(spec.port)], True, "/health") == "failed"

    assert "cannot be read; remove it" in harness.transitions[-1].reason
    assert (state / "shard-1.json").read_text() == "not json"
    assert harness.tagged_pids() == []


@pytest.mark.process
def test_the_command_line_an_engine_shows_once_ready_is_what_adoption_expects(harness):
    proc = ShardProcess.launch(harness.command(free_port()), harness.root / "engine.log")
    wait_until(lambda: psutil.Process(proc.pid).cmdline(), what="the engine to run")
    shown = psutil.Process(proc.pid).cmdline()
    proc.record = proc.record.model_copy(update={"cmdline": ["before", "a", "retitle"]})
    assert identify(proc.record.model_copy(update={"argv": ["x"]})) is not None

    assert proc.refresh_cmdline() is True
    assert proc.record.cmdline == shown and identify(proc.record) is None
    assert proc.refresh_cmdline() is False


def test_a_state_file_for_another_shard_is_not_trusted(harness):
    spec = harness.spec(shard_id="shard-a")
    write_record(harness, spec, [])
    (harness.root / "state" / "shard-a.json").rename(harness.root / "state" / "shard-b.json")
    sup = harness.supervisor(background=False)

    assert sup.adopt_all() == []
    assert "describes shard 'shard-a', not 'shard-b'" in sup.problems[0]
