"""Stopping shards: whole process groups, sidecars included, SIGKILL after the grace."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from stub_engine import STUB, gone

from tests.support.polling import wait_until
from tests.support.ports import free_port


def start_ready(harness, sup, *flags, sidecar=False):
    spec = harness.spec()
    commands = [harness.command(spec.port, *flags)]
    if sidecar:
        commands.insert(0, harness.command(free_port(), name="ray-head"))
    sup.start(spec, commands, True, "/health")
    harness.wait_for(spec.shard_id, "ready")
    return spec, sup.running()[0]


@pytest.mark.process
def test_stop_takes_the_sidecars_down_with_the_engine(harness):
    sup = harness.supervisor()
    spec, shard = start_ready(harness, sup, sidecar=True)
    sidecar_pid, engine_pid = shard.pgids

    sup.stop(spec.shard_id, grace=10)

    assert harness.transitions[-1].state == "stopped"
    assert harness.transitions[-1].reason == "stopped"
    assert gone(sidecar_pid) and gone(engine_pid)
    assert sup.running() == [] and sup.pids() == {}
    assert not (harness.root / "state" / f"{spec.shard_id}.json").exists()


@pytest.mark.process
def test_engine_that_ignores_sigterm_gets_sigkill_after_the_grace(harness):
    sup = harness.supervisor()
    spec, shard = start_ready(harness, sup, "--ignore-sigterm")

    sup.stop(spec.shard_id, grace=1)

    stopped = harness.transitions[-1]
    assert stopped.state == "stopped"
    assert f"engine (pid {shard.pid}) ignored SIGTERM for 1s and got SIGKILL" in stopped.reason
    assert gone(shard.pid)


def reported_child(sup, shard_id):
    def child_pid():
        found = re.search(r"child pid (\d+)", "\n".join(sup.logs.read(shard_id)))
        return int(found.group(1)) if found else None

    return wait_until(child_pid, what="the stub to report its child")


@pytest.mark.process
def test_a_forked_child_is_killed_with_the_group(harness):
    sup = harness.supervisor()
    spec, shard = start_ready(harness, sup, "--fork-child", "--ignore-sigterm")
    child = reported_child(sup, spec.shard_id)
    assert not gone(child)

    sup.stop(spec.shard_id, grace=1)

    assert gone(shard.pid) and gone(child)


@pytest.mark.process
def test_a_child_in_a_session_of_its_own_still_belongs_to_the_shard(harness):
    sup = harness.supervisor()
    spec, shard = start_ready(harness, sup, "--fork-child", "--child-session")
    child = reported_child(sup, spec.shard_id)
    wait_until(lambda: os.getpgid(child) == child, what="the child to leave the group")

    sweep = sup.kill_unidentified_gpu_processes([child], grace=1)
    assert (sweep.killed, sweep.unexpected) == ([], [])
    assert not gone(child)

    sup.stop(spec.shard_id, grace=1)

    assert gone(shard.pid) and gone(child)


@pytest.mark.process
def test_a_sidecar_that_exits_fails_the_shard_and_stops_the_engine(harness):
    sup = harness.supervisor()
    spec = harness.spec()
    sidecar = harness.command(
        free_port(), "--crash-after", "2", "--exit-code", "5", name="ray-head"
    )
    sup.start(spec, [sidecar, harness.command(spec.port)], True, "/health")
    engine_pid = harness.wait_for(spec.shard_id, "ready").pid

    failed = harness.wait_for(spec.shard_id, "failed")

    assert failed.reason.startswith("sidecar ray-head (pid ")
    assert failed.reason.endswith("exited with code 5") and failed.exit_code == 5
    assert "stub crashing with exit code 5" in failed.output_tail
    assert gone(engine_pid)


@pytest.mark.process
def test_an_engine_killed_from_outside_fails_with_the_signal(harness):
    sup = harness.supervisor()
    spec, shard = start_ready(harness, sup)

    subprocess.run(["kill", "-9", str(shard.pid)], check=True)

    failed = harness.wait_for(spec.shard_id, "failed")
    assert failed.reason.endswith("was killed by SIGKILL") and failed.exit_code == -9


@pytest.mark.process
def test_gpu_processes_no_shard_describes_are_killed(harness):
    sup = harness.supervisor()
    spec, shard = start_ready(harness, sup)
    stray = subprocess.Popen(  # an engine of this user, as argv[0] shows it
        ["llama-server", str(STUB), "--port", str(free_port()), "--tag", harness.tag],
        executable=sys.executable,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
    )
    try:
        wait_until(lambda: stray.pid in harness.tagged_pids(), what="the stray process")

        sweep = sup.kill_unidentified_gpu_processes([stray.pid, shard.pid, 999_999_999], grace=2)

        assert (sweep.killed, sweep.unexpected) == ([stray.pid], [])
        assert stray.wait(timeout=30) is not None
        assert not gone(shard.pid)
        assert sup.running()[0].state == "ready"
    finally:
        stray.kill()
        stray.wait(timeout=30)
