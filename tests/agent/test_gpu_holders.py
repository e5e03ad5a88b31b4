"""At agent start only this user's engines that no shard explains are killed; the rest is reported.

Every test runs real processes and hands their pids to the supervisor as NVML would.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import sys

import psutil
import pytest
from stub_engine import STUB, gone

from agent_worker.engines.command import LaunchCommand
from agent_worker.supervision.gpu_holders import looks_like_engine
from protocol.gpu_users import UnexpectedGpuUser
from tests.support.polling import wait_until

AGENT_USER = pwd.getpwuid(os.getuid()).pw_name


@pytest.fixture
def spawn():
    """Start a command in a session of its own; kill its whole group after the test."""
    started: list[subprocess.Popen[bytes]] = []

    def start(*argv: str, shown_as: str | None = None) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(argv, start_new_session=True, stdout=subprocess.PIPE)
        started.append(proc)
        if shown_as is not None:  # wait for bash's exec -a, so NVML would see the engine
            wait_until(lambda: _cmdline(proc.pid)[:1] == [shown_as], what=f"{shown_as} to run")
        return proc

    yield start
    for proc in started:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        if proc.stdout:
            proc.stdout.close()


def _cmdline(pid: int) -> list[str]:
    try:
        return psutil.Process(pid).cmdline()
    except psutil.Error:
        return []


def as_engine(command: str) -> tuple[str, ...]:
    """A bash command line that runs ``command`` with llama-server as its argv[0]."""
    return ("bash", "-c", f"exec -a llama-server {command}")


@pytest.mark.parametrize(
    ("cmdline", "engine"),
    [
        (["/opt/llama/bin/llama-server", "-m", "m.gguf", "--port", "8001"], True),
        (["/venv/bin/python3.11", "/venv/bin/vllm", "serve", "/models/qwen"], True),
        (["/venv/bin/vllm", "serve", "/models/qwen"], True),
        (["python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "m"], True),
        (["/venv/bin/python", "-X", "dev", "-m", "sglang.launch_server", "--tp-size", "2"], True),
        (["VLLM::EngineCore_DP0"], True),
        (["VLLM::Worker_TP1"], True),
        (["sglang::scheduler_TP0"], True),
        (["ray::RayWorkerWrapper.execute_method"], True),
        (["/venv/bin/python", "/venv/bin/vllm", "bench", "throughput"], False),
        (["python3", "-m", "sglang.bench_serving"], False),
        (["python3", "-c", "import vllm"], False),
        (["python3", "train.py", "--model", "llama-server"], False),
        (["ray::IDLE"], False),
        (["/usr/lib/xorg/Xorg", ":0"], False),
        (["sleep", "60"], False),
        ([], False),
    ],
    ids=lambda value: " ".join(value)[:40] if isinstance(value, list) else str(value),
)
def test_looks_like_engine_knows_the_command_lines_llmgw_starts(cmdline, engine):
    assert looks_like_engine(cmdline) is engine


@pytest.mark.process
def test_a_gpu_holder_that_is_not_an_engine_is_left_running_and_reported(harness, spawn):
    holder = spawn("sleep", "300")
    wait_until(lambda: _cmdline(holder.pid) == ["sleep", "300"], what="sleep to run")

    sweep = harness.supervisor().kill_unidentified_gpu_processes([holder.pid], grace=1)

    assert sweep.killed == []
    assert sweep.unexpected == [
        UnexpectedGpuUser(pid=holder.pid, user=AGENT_USER, name="sleep", cmdline="sleep 300")
    ]
    assert not gone(holder.pid)


@pytest.mark.process
def test_an_engine_of_this_user_that_no_shard_explains_is_killed(harness, spawn):
    engine = spawn(*as_engine("sleep 300"), shown_as="llama-server")

    sweep = harness.supervisor().kill_unidentified_gpu_processes([engine.pid], grace=1)

    assert (sweep.killed, sweep.unexpected) == ([engine.pid], [])
    assert engine.wait(timeout=30) is not None


@pytest.mark.process
def test_an_engine_a_script_started_is_killed_without_the_script(harness, spawn):
    script = spawn("bash", "-c", "(exec -a llama-server sleep 300) & echo $!; wait")
    assert script.stdout is not None
    engine_pid = int(script.stdout.readline())
    wait_until(lambda: _cmdline(engine_pid)[:1] == ["llama-server"], what="the engine to run")

    sweep = harness.supervisor().kill_unidentified_gpu_processes([engine_pid], grace=1)

    assert sweep.killed == [engine_pid]
    wait_until(lambda: gone(engine_pid), what="the engine to die")
    assert script.wait(timeout=30) == 0  # it saw its child end instead of being killed


def _as_nobody() -> tuple[str, ...]:
    if os.getuid() != 0:
        pytest.skip("starting a process as another user needs root")
    if shutil.which("setpriv"):
        return ("setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups")
    if shutil.which("runuser"):
        return ("runuser", "-u", "nobody", "--")
    pytest.skip("neither setpriv nor runuser is installed to start a process as nobody")


@pytest.mark.process
def test_another_users_engine_is_left_running_and_reported(harness, spawn):
    other = spawn(*_as_nobody(), *as_engine("sleep 300"), shown_as="llama-server")
    assert psutil.Process(other.pid).uids().real == pwd.getpwnam("nobody").pw_uid

    sweep = harness.supervisor().kill_unidentified_gpu_processes([other.pid], grace=1)

    assert sweep.killed == []
    assert sweep.unexpected == [
        UnexpectedGpuUser(pid=other.pid, user="nobody", name="sleep", cmdline="llama-server 300")
    ]
    assert not gone(other.pid)


@pytest.mark.process
def test_a_gpu_holder_a_shard_accounts_for_is_neither_killed_nor_reported(harness, spawn):
    sup = harness.supervisor()
    spec = harness.spec()
    # The shard's engine looks like a stray one would: only the shard's records tell them apart.
    stub = f"{sys.executable} {STUB} --port {spec.port} --tag {harness.tag}"
    shard_engine = LaunchCommand(argv=as_engine(stub), name="llama-server")
    sup.start(spec, [shard_engine], serves_http=True, health_path="/health")
    shard_pid = harness.wait_for(spec.shard_id, "ready").pid
    assert looks_like_engine(_cmdline(shard_pid))
    stray = spawn(*as_engine("sleep 300"), shown_as="llama-server")

    sweep = sup.kill_unidentified_gpu_processes([shard_pid, stray.pid, 999_999_999], grace=1)

    assert (sweep.killed, sweep.unexpected) == ([stray.pid], [])
    assert not gone(shard_pid)
    assert sup.running()[0].state == "ready"


def test_a_sweep_with_no_gpu_holders_does_nothing(harness):
    sweep = harness.supervisor().kill_unidentified_gpu_processes([], grace=1)

    assert (sweep.killed, sweep.unexpected) == ([], [])


def test_the_agent_itself_and_pids_gone_since_nvml_listed_them_are_skipped(harness):
    sweep = harness.supervisor().kill_unidentified_gpu_processes(
        [os.getpid(), 1, 999_999_999], grace=1
    )

    assert (sweep.killed, sweep.unexpected) == ([], [])
