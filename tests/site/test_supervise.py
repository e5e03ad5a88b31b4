"""`llmgw up`'s supervisor: restarts with backoff, gives up on a crash loop, reaps orphans."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from llmgw_cli.supervise import (
    Child,
    ChildSupervisor,
    LogEcho,
    ProcessChild,
    RestartPolicy,
    ServiceChild,
    pid_alive,
    reap_orphans,
)
from tests.processes.support import wait_until


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FlakyChild(Child):
    """A child whose death the test decides; it counts its starts."""

    def __init__(self, log_path: Path) -> None:
        self.name = "flaky"
        self.log_path = log_path
        self.starts = 0
        self.dead = False

    def start(self) -> None:
        self.starts += 1
        self.dead = False

    def exit_reason(self) -> str | None:
        return "exited with code 1" if self.dead else None

    def pid(self) -> int | None:
        return 100 + self.starts

    def stop(self, grace: float) -> None:
        self.dead = True


def _supervisor(child: Child, clock: Clock, said: list[str]) -> ChildSupervisor:
    return ChildSupervisor([child], RestartPolicy(), clock=clock, say=said.append)


def test_a_dead_child_is_restarted_after_a_delay_that_doubles_up_to_thirty_seconds(tmp_path):
    clock, said = Clock(), []
    child = FlakyChild(tmp_path / "flaky.log")
    supervisor = _supervisor(child, clock, said)
    supervisor.start_all()
    delays = []
    for _ in range(8):
        # Up 15 s each time: never the minute that resets the delay, and never five
        # failures within a minute, which would leave it down.
        clock.now += 15
        child.dead = True
        supervisor.check()
        entry = supervisor.entries[0]
        if entry.given_up:
            break
        delays.append(entry.restart_at - clock.now)
        clock.now = entry.restart_at - 0.01
        supervisor.check()
        assert child.starts == len(delays), "restarted before its delay was over"
        clock.now = entry.restart_at
        supervisor.check()
        assert child.starts == len(delays) + 1
    assert delays == [1, 2, 4, 8, 16, 30, 30, 30]
    assert "flaky exited with code 1; restarting it in 1s" in said
    assert "restarted flaky (pid 102)" in said


def test_a_child_that_stayed_up_a_minute_starts_again_from_one_second(tmp_path):
    clock, said = Clock(), []
    child = FlakyChild(tmp_path / "flaky.log")
    supervisor = _supervisor(child, clock, said)
    supervisor.start_all()
    entry = supervisor.entries[0]
    for _ in range(3):
        clock.now += 1
        child.dead = True
        supervisor.check()
        clock.now = entry.restart_at
        supervisor.check()
    assert entry.delay == 4
    clock.now += 60
    child.dead = True
    supervisor.check()
    assert entry.delay == 1


def test_five_failures_within_a_minute_leave_the_child_down_with_its_last_output(tmp_path):
    clock, said = Clock(), []
    log = tmp_path / "flaky.log"
    log.write_text("".join(f"line {n}\n" for n in range(100)) + "ImportError: no module x\n")
    child = FlakyChild(log)
    supervisor = _supervisor(child, clock, said)
    supervisor.start_all()
    entry = supervisor.entries[0]
    for _ in range(5):
        child.dead = True
        supervisor.check()
        if entry.given_up:
            break
        clock.now = entry.restart_at
        supervisor.check()
    assert entry.given_up and child.starts == 5
    report = said[-1]
    assert "failed 5 times within 60s, so it stays down" in report
    assert "ImportError: no module x" in report and "line 81" in report and "line 79" not in report
    clock.now += 3600
    supervisor.check()
    assert child.starts == 5  # left down
    assert supervisor.pids() == {"flaky": None}


def test_a_killed_process_child_is_named_by_its_signal_and_its_group_is_cleared(tmp_path):
    # The child leaves a grandchild in its group, as Celery's embedded beat does.
    script = "import subprocess, time; subprocess.Popen(['sleep', '300']); time.sleep(300)"
    child = ProcessChild("worker", [sys.executable, "-c", script], tmp_path / "worker.log",
                         dict(os.environ), tmp_path)  # fmt: skip
    child.start()
    try:
        parent = psutil.Process(child.pid())
        grandchild = wait_until(lambda: parent.children(), 10, "the grandchild")[0]
        assert child.exit_reason() is None
        os.kill(child.pid(), signal.SIGKILL)
        reason = wait_until(child.exit_reason, 10, "the child's death")
        assert reason == "was killed by SIGKILL"
        wait_until(lambda: not pid_alive(grandchild.pid), 10, "the grandchild to be killed too")
    finally:
        child.stop(grace=1)


def test_a_process_child_writes_its_output_to_its_log_file(tmp_path):
    child = ProcessChild("talker", [sys.executable, "-c", "print('hello'); raise SystemExit(3)"],
                         tmp_path / "talker.log", dict(os.environ), tmp_path)  # fmt: skip
    child.start()
    assert wait_until(child.exit_reason, 10, "the child to exit") == "exited with code 3"
    assert (tmp_path / "talker.log").read_text() == "hello\n"


def test_a_daemon_killed_and_left_a_zombie_is_seen_as_down_and_reaped(tmp_path):
    # A daemonized server, re-parented to us as it would be to `llmgw up` (a subreaper).
    pid_file = tmp_path / "server.pid"
    server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    pid_file.write_text(f"{server.pid}\n")
    service = ServiceChild("server", lambda: None, lambda: int(pid_file.read_text()),
                           lambda: None, tmp_path / "server.log")  # fmt: skip
    assert service.exit_reason() is None
    server.kill()
    wait_until(lambda: psutil.Process(server.pid).status() == psutil.STATUS_ZOMBIE, 10, "a zombie")
    assert service.exit_reason() == f"not running (pid {server.pid} is gone)"
    # Not one of the supervisor's own children: reaped like an adopted orphan.
    assert reap_orphans(lambda: set()) >= 1
    assert not psutil.pid_exists(server.pid)
    server.returncode = -9  # its Popen lost the status to the reaper, as intended here


def test_log_echo_prints_whole_new_lines_prefixed_and_follows_a_truncation(tmp_path):
    log = tmp_path / "router.log"
    log.write_text("from an earlier run\n")
    printed: list[str] = []
    echo = LogEcho([log], out=printed.append)
    with log.open("a") as file:
        file.write("one\ntw")
    echo.pump()
    assert printed == ["router | one\n"]
    with log.open("a") as file:
        file.write("o\n")
    echo.pump()
    assert printed[-1] == "router | two\n"
    log.write_text("after rotation\n")  # shorter than what was read: truncated
    echo.pump()
    assert printed[-1] == "router | after rotation\n"


@pytest.mark.parametrize("code, words", [(0, "exited with code 0"), (-15, "was killed by SIGTERM")])
def test_exits_are_described_in_words(code, words):
    from llmgw_cli.supervise import describe_exit

    assert describe_exit(code) == words


def test_start_failures_count_like_exits(tmp_path):
    clock, said = Clock(), []

    class Broken(FlakyChild):
        def start(self) -> None:
            self.starts += 1
            raise RuntimeError("embedded PostgreSQL did not start; see /x/log")

    child = Broken(tmp_path / "b.log")
    supervisor = _supervisor(child, clock, said)
    supervisor.start_all()
    assert said == [
        "flaky failed to start (embedded PostgreSQL did not start; see /x/log); restarting it in 1s"
    ]
    clock.now += 1
    supervisor.check()
    assert child.starts == 2


def test_llmgw_supervise_restarts_its_command_and_stops_on_sigterm(tmp_path):
    log = tmp_path / "sleeper.log"
    script = "import os, time; print('up', os.getpid(), flush=True); time.sleep(300)"
    supervisor = subprocess.Popen(
        [sys.executable, "-m", "llmgw_cli.cli", "supervise", "sleeper", "--log", str(log), "--",
         sys.executable, "-c", script],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip
    try:

        def commands() -> list[psutil.Process]:
            found = []
            for child in psutil.Process(supervisor.pid).children():
                with contextlib.suppress(psutil.Error):
                    if script in " ".join(child.cmdline()) and child.status() != "zombie":
                        found.append(child)
            return found

        first = wait_until(commands, 30, "the command")[0]
        wait_until(lambda: log.exists() and f"up {first.pid}" in log.read_text(), 30,
                 "the command's output")  # fmt: skip
        first.kill()
        second = wait_until(lambda: [c for c in commands() if c.pid != first.pid], 30,
                          "the command to be restarted")[0]  # fmt: skip
        supervisor.send_signal(signal.SIGTERM)
        output, _ = supervisor.communicate(timeout=30)
    finally:
        if supervisor.poll() is None:
            os.killpg(supervisor.pid, signal.SIGKILL)
    assert supervisor.returncode == 0
    assert "sleeper was killed by SIGKILL; restarting it in 1s" in output
    assert f"restarted sleeper (pid {second.pid})" in output
    assert f"sleeper | up {second.pid}" in output  # its output, echoed
    assert not pid_alive(second.pid)


def test_a_childs_log_is_rotated_while_it_keeps_writing_to_it(tmp_path):
    from llmgw_cli.supervise import rotate_logs

    script = (
        "import sys, time\n"
        "sys.stdout.write('x' * 2_000_000 + '\\n'); sys.stdout.flush()\n"
        "time.sleep(1); print('after rotation', flush=True); time.sleep(300)\n"
    )
    child = ProcessChild("chatty", [sys.executable, "-c", script], tmp_path / "chatty.log",
                         dict(os.environ), tmp_path)  # fmt: skip
    child.start()
    try:
        wait_until(lambda: child.log_path.stat().st_size > 2_000_000, 10, "the first output")
        rotate_logs([child], max_bytes=1024 * 1024, keep=2)
        rotated = tmp_path / "chatty.log.1"
        assert rotated.stat().st_size > 2_000_000
        wait_until(lambda: b"after rotation" in child.log_path.read_bytes(), 10, "more output")
        # The child's own descriptor writes at the new end: no hole of NUL bytes before it.
        assert child.log_path.read_bytes() == b"after rotation\n"
    finally:
        child.stop(grace=1)
