"""Engines of a root agent run as the engine user, each shard in a group of its own: they
read their own secrets, and neither another shard's, nor the agent's files or environment."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

import pytest

from agent_worker.engines.command import LaunchCommand, SecretFile
from agent_worker.supervision.engine_user import SHARD_GID_BASE, engine_user
from agent_worker.supervision.gpu_holders import sweep_gpu_holders
from agent_worker.supervision.shard_files import SHARED_FILES
from agent_worker.supervisor import Supervisor
from agent_worker.weights.access import WEIGHTS_GID_BASE, restrict_store, weights_gid
from protocol.shard import ShardSpec
from tests.support.polling import wait_until
from tests.support.ports import free_port

pytestmark = [
    pytest.mark.process,
    pytest.mark.skipif(os.geteuid() != 0, reason="an agent that is not root keeps its engines"),
]

# Prints its secret (from the path the supervisor appends) into its log, then stays up as
# a worker rank does.
READS_ITS_SECRET = ("/bin/sh", "-c", 'cat "$1" && echo && exec sleep 600', "sh")


def spec(shard_id: str) -> ShardSpec:
    return ShardSpec(shard_id=shard_id, replica_id=f"r-{shard_id}", model="m", source="/m",
                     engine="llama.cpp", port=free_port(),
                     api_key=f"secret-of-{shard_id}")  # fmt: skip


def status_ids(pid: int) -> tuple[int, int, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    field = {line.split(":")[0]: line.split(":", 1)[1].split() for line in lines}
    return int(field["Uid"][0]), int(field["Gid"][0]), " ".join(field["Groups"])


def as_identity(uid: int, gid: int, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, user=uid, group=gid, extra_groups=[], capture_output=True,
                          text=True, timeout=30, check=False)  # fmt: skip


@pytest.fixture
def engines(tmp_path):
    # A store the engine user can reach, as /var/lib/llmgw's is (the test's home is 0700).
    store = Path(tempfile.mkdtemp(prefix="llmgw-weights-"))
    store.chmod(0o711)
    user = engine_user("", tmp_path / "agent", store / "weights")
    assert user is not None
    seen = []
    sup = Supervisor(tmp_path / "agent" / "shards", tmp_path / "agent" / "logs", seen.append,
                     poll_interval=0.1, settle=0.5, engine_user=user)  # fmt: skip
    yield user, sup, seen, tmp_path
    for shard in sup.running():
        sup.stop(shard.spec.shard_id, grace=1.0)
    sup.shutdown()
    shutil.rmtree(store)


def start(sup: Supervisor, seen: list, tmp_path: Path, shard_id: str,
          argv: tuple[str, ...] = READS_ITS_SECRET) -> tuple[ShardSpec, int]:  # fmt: skip
    shard = spec(f"{shard_id}-{uuid.uuid4().hex[:12]}")
    shard_id = shard.shard_id
    secret = SecretFile("", "api-key", shard.api_key)  # its path alone, after argv
    command = LaunchCommand(argv=argv, name="rpc-server", secret_files=(secret,))
    sup.start(shard, [command], serves_http=False)
    ready = wait_until(lambda: next((t for t in seen if t.shard_id == shard_id and
                                     t.state in ("ready", "failed")), None),
                       what=f"{shard_id} ready")  # fmt: skip
    assert ready.state == "ready", ready.reason
    log = tmp_path / "agent" / "logs" / f"{shard_id}.log"
    assert shard.api_key in log.read_text()  # it read its own secret
    return shard, ready.pid


def test_a_root_agents_engines_run_as_the_engine_user_in_a_group_of_their_own(engines):
    user, sup, seen, tmp_path = engines

    shard, pid = start(sup, seen, tmp_path, "shard-a")

    uid, gid, groups = status_ids(pid)
    assert uid == user.uid != 0
    assert gid == user.shard_gid(shard.shard_id) >= SHARD_GID_BASE
    assert groups == ""  # none of root's groups
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    assert f"HOME={user.home}".encode() in environ and f"USER={user.name}".encode() in environ
    assert user.home.is_relative_to(tmp_path / "agent") and user.home.stat().st_uid == user.uid
    assert shard.api_key not in Path(f"/proc/{pid}/cmdline").read_text()


def test_an_engine_reads_neither_another_shards_secret_nor_the_agents_files(engines):
    user, sup, seen, tmp_path = engines
    first, first_pid = start(sup, seen, tmp_path, "shard-a")
    second, second_pid = start(sup, seen, tmp_path, "shard-b")
    _, second_gid, _ = status_ids(second_pid)
    agent_pid = str(os.getpid())  # the supervisor's process stands for the agent

    for path in (
        SHARED_FILES / first.shard_id / "api-key",  # another shard's secret
        tmp_path / "agent" / "shards" / f"{first.shard_id}.json",  # the agent's state
        Path(f"/proc/{agent_pid}/environ"),  # the agent's environment
        Path(f"/proc/{first_pid}/environ"),  # another engine's environment
    ):
        read = as_identity(user.uid, second_gid, "/bin/cat", str(path))
        assert read.returncode != 0, f"{path} was readable: {read.stdout[:80]!r}"
        assert "Permission denied" in read.stderr


def test_the_gpu_sweep_kills_only_the_engine_users_processes():
    root_engine = subprocess.Popen(["/bin/bash", "-c", "exec -a llama-server sleep 600"],
                                   start_new_session=True)  # fmt: skip
    try:
        wait_until(lambda: Path(f"/proc/{root_engine.pid}/cmdline").read_bytes()
                   .startswith(b"llama-server"), what="the stand-in to take its name")  # fmt: skip
        sweep = sweep_gpu_holders([root_engine.pid], set(), set(), 1.0, engines_uid=65534)
        assert sweep.killed == [] and [u.pid for u in sweep.unexpected] == [root_engine.pid]
        assert root_engine.poll() is None  # root's engine-looking process is left running
    finally:
        root_engine.kill()
        root_engine.wait()


# Reads the weights named by -m (a file, or a directory's config.json) into its log, then
# its secret, and stays up.
READS_ITS_WEIGHTS = ("/bin/sh", "-c", 'cat "$2" "$3" && echo && exec sleep 600', "sh", "-m")


def test_an_engine_reads_the_weights_it_names_and_no_other_models(engines):
    """Each entry of the store has a group of its own, which only the shards whose command
    line names it get: another model's weights stay closed, even to an engine that knows
    their path. Entries already in the store when the agent starts are closed too."""
    user, sup, seen, tmp_path = engines
    store = user.weights_dir
    mine, other = store / "mine.gguf", store / "other-model"
    mine.write_text("weights of mine\n")
    other.mkdir()
    (other / "config.json").write_text("weights of another model\n")
    restrict_store(store)  # as the agent's start does (and a fetch, for each new file)

    shard, pid = start(sup, seen, tmp_path, "reader", (*READS_ITS_WEIGHTS, str(mine)))

    log = tmp_path / "agent" / "logs" / f"{shard.shard_id}.log"
    assert "weights of mine" in log.read_text()
    uid, gid, groups = status_ids(pid)
    assert groups == str(weights_gid(mine.name))  # that entry's group, and no other
    assert WEIGHTS_GID_BASE >= SHARD_GID_BASE + 2**24  # never a shard's
    for path in (other / "config.json", mine.with_name("mine.gguf.source.json")):
        read = subprocess.run(["/bin/cat", str(path)], user=uid, group=gid,
                              extra_groups=[int(g) for g in groups.split()],
                              capture_output=True, text=True, timeout=30, check=False)  # fmt: skip
        assert read.returncode != 0, f"{path} was readable: {read.stdout[:80]!r}"
    assert "Permission denied" in read.stderr or "No such file" in read.stderr
    write = subprocess.run(["/bin/sh", "-c", ': >> "$1"', "sh", str(mine)], user=uid, group=gid,
                           extra_groups=[weights_gid(mine.name)], capture_output=True, text=True,
                           timeout=30, check=False)  # fmt: skip
    assert write.returncode != 0 and "Permission denied" in write.stderr  # read, never write
