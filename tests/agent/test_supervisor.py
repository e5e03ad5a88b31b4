"""Starting shards: readiness, failure with the engine's last words, rendezvous, redelivery."""

from __future__ import annotations

import json
import socket
import stat
from pathlib import Path

import pytest
from stub_engine import gone

from agent_worker.engines.command import LaunchCommand, Listener, SecretFile
from agent_worker.supervisor import Supervisor
from tests.support.polling import wait_until
from tests.support.ports import free_port


@pytest.mark.process
def test_http_shard_is_ready_once_health_answers_200(harness):
    sup = harness.supervisor()
    spec = harness.spec(api_key="secret")
    command = harness.command(spec.port, "--ready-after", "1", "--api-key", "secret")

    assert sup.start(spec, [command], serves_http=True, health_path="/health") == "starting"

    ready = harness.wait_for(spec.shard_id, "ready")
    assert harness.states(spec.shard_id) == ["starting", "ready"]
    assert ready.replica_id == spec.replica_id and ready.fingerprint == "fp-1"
    [shard] = sup.running()
    assert (shard.state, shard.pid, shard.adopted) == ("ready", ready.pid, False)
    assert sup.pids() == {spec.shard_id: ready.pid}  # its own session: pgid is its pid
    saved = json.loads((harness.root / "state" / f"{spec.shard_id}.json").read_text())
    assert saved["spec"]["shard_id"] == spec.shard_id
    assert [p["pid"] for p in saved["processes"]] == [ready.pid]
    assert saved["processes"][0]["cmdline"][-5:] == list(command.argv[-5:])


@pytest.mark.process
def test_the_secret_reaches_the_engine_by_a_private_file_never_its_command_line(harness):
    sup = harness.supervisor()
    spec = harness.spec(api_key="s3cret-of-the-replica")
    secret = SecretFile("--api-key-file", "api-key", spec.api_key)
    command = harness.command(spec.port, "--ready-after", "0.5", secret_files=(secret,))

    sup.start(spec, [command], serves_http=True, health_path="/health")

    ready = harness.wait_for(spec.shard_id, "ready")  # the stub answers only with the key
    cmdline = Path(f"/proc/{ready.pid}/cmdline").read_bytes().decode()
    assert "s3cret" not in cmdline
    key_file = Path(cmdline.split("\0")[cmdline.split("\0").index("--api-key-file") + 1])
    assert key_file.read_text() == spec.api_key
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    sup.stop(spec.shard_id, grace=2.0)
    assert not key_file.exists() and not key_file.parent.exists()


@pytest.mark.process
def test_a_secret_in_the_environment_stays_out_of_the_command_line(harness):
    sup = harness.supervisor()
    spec = harness.spec(api_key="s3cret-of-the-replica")
    command = harness.command(spec.port, secret_env={"VLLM_API_KEY": spec.api_key})

    sup.start(spec, [command], serves_http=True, health_path="/health")

    ready = harness.wait_for(spec.shard_id, "ready")
    assert b"s3cret" not in Path(f"/proc/{ready.pid}/cmdline").read_bytes()
    assert b"VLLM_API_KEY=s3cret" in Path(f"/proc/{ready.pid}/environ").read_bytes()


@pytest.mark.process
def test_engine_without_the_api_key_header_is_never_ready(harness):
    sup = harness.supervisor()
    spec = harness.spec()  # no key, but the engine wants one: 401 is not 200
    sup.start(spec, [harness.command(spec.port, "--api-key", "other")], True, "/health")

    wait_until(lambda: "401" in (sup.running()[0].detail or ""), what="a 401 from the engine")
    assert sup.running()[0].state == "starting"


@pytest.mark.process
def test_exited_engine_fails_with_its_exit_code_and_last_lines(harness):
    sup = harness.supervisor()
    spec = harness.spec()
    flags = ("--print-lines", "100", "--crash-after", "0.5", "--exit-code", "3")
    sup.start(spec, [harness.command(spec.port, *flags)], True, "/health")

    failed = harness.wait_for(spec.shard_id, "failed")
    assert failed.exit_code == 3
    assert "engine" in failed.reason and "exited with code 3" in failed.reason
    assert 30 <= len(failed.output_tail) <= 40
    assert failed.output_tail[-1] == "stub crashing with exit code 3"
    assert sup.running() == [] and sup.pids() == {}
    assert not (harness.root / "state" / f"{spec.shard_id}.json").exists()
    assert "stub crashing with exit code 3" in sup.logs.read(spec.shard_id, 5)[-2]


@pytest.mark.process
def test_worker_rank_is_ready_after_staying_alive(harness):
    sup = harness.supervisor(settle=1.0)
    spec = harness.spec(rank=1, world_size=2)
    sup.start(spec, [harness.command(spec.port, "--ready-after", "999")], False, "/health")

    ready = harness.wait_for(spec.shard_id, "ready")
    assert "alive for 1s" in ready.reason


@pytest.mark.process
def test_redelivered_start_launches_nothing_and_reports_where_the_shard_stands(harness):
    sup = harness.supervisor()
    spec = harness.spec()
    command = harness.command(spec.port)
    sup.start(spec, [command], True, "/health")
    first = harness.wait_for(spec.shard_id, "ready")

    assert sup.start(spec, [command], True, "/health") == "ready"
    assert harness.transitions[-1].state == "ready"
    assert "start ignored" in harness.transitions[-1].reason
    assert [s.pid for s in sup.running()] == [first.pid]
    assert len(harness.tagged_pids()) == 1

    sup.stop(spec.shard_id, grace=5)
    assert sup.start(spec, [command], True, "/health") == "stopped"
    assert harness.transitions[-1].state == "stopped"
    assert sup.running() == [] and harness.tagged_pids() == []


@pytest.mark.process
def test_start_of_a_failed_shard_reports_the_failure_again(harness):
    sup = harness.supervisor()
    spec = harness.spec()
    command = harness.command(spec.port, "--crash-after", "0", "--exit-code", "7")
    sup.start(spec, [command], True, "/health")
    failed = harness.wait_for(spec.shard_id, "failed")

    assert sup.start(spec, [command], True, "/health") == "failed"
    assert harness.transitions[-1] == failed


@pytest.mark.process
def test_command_waits_for_its_port_before_the_next_starts(harness):
    sup = harness.supervisor()
    spec = harness.spec()
    head_port = harness.spec().port
    head = harness.command(head_port, name="head", wait_for_port=("127.0.0.1", head_port))
    sup.start(spec, [head, harness.command(spec.port)], True, "/health")

    harness.wait_for(spec.shard_id, "ready")
    [shard] = sup.running()
    assert len(shard.pgids) == 2 and shard.pid == shard.pgids[-1]
    notes = "\n".join(sup.logs.read(spec.shard_id))
    assert f"head: 127.0.0.1:{head_port} accepts connections" in notes


@pytest.mark.process
def test_rendezvous_that_never_listens_fails_the_shard_and_kills_the_sidecar(harness):
    sup = harness.supervisor()
    spec = harness.spec()
    silent = harness.spec().port  # nothing will listen here
    head = harness.command(
        harness.spec().port, name="ray-head", wait_for_port=("127.0.0.1", silent), wait_timeout=1.5
    )
    sup.start(spec, [head, harness.command(spec.port)], True, "/health")

    failed = harness.wait_for(spec.shard_id, "failed")
    assert f"127.0.0.1:{silent}" in failed.reason and "1.5s" in failed.reason
    assert "ray-head" in failed.reason
    assert gone(failed.pid)  # the sidecar: the engine itself never started
    assert harness.tagged_pids() == []


def test_shard_whose_port_is_taken_fails_without_launching(harness):
    sup = harness.supervisor(background=False)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        spec = harness.spec(port=taken.getsockname()[1])
        assert sup.start(spec, [harness.command(spec.port)], True, "/health") == "failed"
    assert "already in use" in harness.transitions[-1].reason
    assert harness.tagged_pids() == []


def test_engine_that_cannot_be_executed_fails_the_shard(harness):
    sup = harness.supervisor(background=False)
    spec = harness.spec()
    missing = LaunchCommand(argv=(str(harness.root / "no-such-engine"),), name="llama-server")

    assert sup.start(spec, [missing], True, "/health") == "failed"
    assert "could not start llama-server" in harness.transitions[-1].reason
    assert sup.running() == []


@pytest.mark.parametrize("shard_id", ["../escape", "a/b", "..", ".hidden", "", "a..b", "x" * 200])
def test_unsafe_shard_ids_are_refused(harness, shard_id):
    sup: Supervisor = harness.supervisor(background=False)
    spec = harness.spec().model_copy(update={"shard_id": shard_id})

    with pytest.raises(ValueError, match="not a safe file name"):
        sup.start(spec, [harness.command(spec.port)], True, "/health")
    with pytest.raises(ValueError, match="not a safe file name"):
        sup.stop(shard_id)
    assert list((harness.root / "state").iterdir()) == []
    assert harness.tagged_pids() == []


def test_stop_of_an_unknown_shard_is_answered_stopped_and_a_late_start_is_ignored(harness):
    sup = harness.supervisor(background=False)
    spec = harness.spec()

    # The control plane waits for a stop's answer: silence would keep it stopping forever.
    sup.stop(spec.shard_id)
    [answer] = harness.transitions
    assert (answer.shard_id, answer.state, answer.reason) == (
        spec.shard_id, "stopped", "not running on this node",
    )  # fmt: skip
    assert answer.seq > 0
    # Asked again, it answers again, with the same final state.
    sup.stop(spec.shard_id)
    assert [t.state for t in harness.transitions] == ["stopped", "stopped"]

    assert sup.start(spec, [harness.command(spec.port)], True, "/health") == "stopped"
    assert harness.transitions[-1].replica_id == spec.replica_id
    assert harness.tagged_pids() == []


@pytest.mark.process
def test_step_does_one_round_and_says_whether_it_found_work(harness):
    sup = harness.supervisor(background=False)
    spec = harness.spec()
    sup.start(spec, [harness.command(spec.port)], True, "/health")

    wait_until(lambda: (sup.step(), sup.running()[0].state == "ready")[1], what="ready")
    assert harness.states(spec.shard_id) == ["starting", "ready"]
    assert sup.step() is False


@pytest.mark.process
def test_state_file_holds_the_spec_and_each_process_as_it_starts(harness):
    sup = harness.supervisor(background=False)
    spec = harness.spec(api_key="secret")
    silent = harness.spec().port
    head = harness.command(free_port(), name="head", wait_for_port=("127.0.0.1", silent))
    sup.start(spec, [head, harness.command(spec.port)], True, "/health")
    sup.step()

    path = harness.root / "state" / f"{spec.shard_id}.json"
    saved = json.loads(path.read_text())
    assert saved["spec"] == json.loads(spec.model_dump_json())
    assert saved["commands"] == 2
    assert [p["name"] for p in saved["processes"]] == ["head"]  # the engine waits for it
    assert path.stat().st_mode & 0o777 == 0o600  # the spec carries the replica's key

    sup.stop(spec.shard_id, grace=5)
    assert not path.exists()


@pytest.mark.process
def test_a_worker_rank_starts_only_once_rank_0s_rendezvous_listens(harness):
    import socket

    sup = harness.supervisor(background=False)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        rendezvous_port = probe.getsockname()[1]
    spec = harness.spec(rank=1, world_size=2, rendezvous=f"127.0.0.1:{rendezvous_port}")
    rendezvous = Listener("rank 0's rendezvous", "127.0.0.1", rendezvous_port)
    command = harness.command(spec.port)
    assert sup.start(spec, [command], False, "/health", start_after=[rendezvous]) == "pending"
    sup.step()
    assert harness.tagged_pids() == [] and sup.state_of(spec.shard_id) == "pending"
    with socket.socket() as rank0:
        rank0.bind(("127.0.0.1", rendezvous_port))
        rank0.listen()
        wait_until(lambda: (sup.step(), sup.state_of(spec.shard_id) == "starting")[1],
                   what="the worker to start")  # fmt: skip
    assert len(harness.tagged_pids()) == 1
    sup.stop(spec.shard_id, grace=2)


@pytest.mark.process
def test_rank_0_starts_only_once_every_worker_it_connects_to_listens(harness):
    sup = harness.supervisor(background=False)
    workers = [free_port(), free_port()]
    listeners = [Listener(f"rank {i}'s worker", "127.0.0.1", port)
                 for i, port in enumerate(workers, start=1)]  # fmt: skip
    spec = harness.spec(world_size=3, workers=[f"127.0.0.1:{port}" for port in workers])
    assert sup.start(spec, [harness.command(spec.port)], True, start_after=listeners) == "pending"
    with socket.socket() as first:
        first.bind(("127.0.0.1", workers[0]))
        first.listen()
        sup.step()
        sup.step()
        assert harness.tagged_pids() == []  # rank 2's worker is not listening yet
        with socket.socket() as second:
            second.bind(("127.0.0.1", workers[1]))
            second.listen()
            wait_until(lambda: (sup.step(), sup.state_of(spec.shard_id) == "starting")[1],
                       what="rank 0 to start")  # fmt: skip
    assert len(harness.tagged_pids()) == 1
    sup.stop(spec.shard_id, grace=2)


@pytest.mark.process
def test_a_worker_that_never_appears_fails_rank_0_within_its_startup_timeout(harness):
    sup = harness.supervisor()
    silent = free_port()
    spec = harness.spec(world_size=2, workers=[f"127.0.0.1:{silent}"], startup_timeout=1)
    waits = [Listener("rank 1's worker", "127.0.0.1", silent)]

    sup.start(spec, [harness.command(spec.port)], True, start_after=waits)

    failed = harness.wait_for(spec.shard_id, "failed")
    assert failed.reason == (
        f"rank 1's worker: nothing accepted connections on 127.0.0.1:{silent} within 1s"
    )
    assert harness.tagged_pids() == []


@pytest.mark.process
def test_a_worker_that_listens_is_ready_once_its_port_accepts_and_adopted_ready(harness):
    sup = harness.supervisor(settle=600)  # alive-for-a-while would never make it ready
    spec = harness.spec(rank=1, world_size=2, rendezvous="127.0.0.1:1")

    sup.start(spec, [harness.command(spec.port)], False, ready_when_listening=True)

    ready = harness.wait_for(spec.shard_id, "ready")
    assert ready.reason == f"accepts connections on 127.0.0.1:{spec.port} (a worker rank)"
    sup.shutdown()
    again = harness.supervisor(settle=600)
    [adopted] = again.adopt_all()
    assert adopted.state == "ready" and adopted.spec.shard_id == spec.shard_id
    again.stop(spec.shard_id, grace=2)
