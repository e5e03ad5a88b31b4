"""An engine turned against its node: what the engine user may do (issue 38 parts 3, 4).

For every rank of the replicas attacked, as that engine's own identity (its uid, group and
groups, read from ``/proc/<pid>/status``; a compromised engine has exactly these):

- run as root at all (every process of the shard's group);
- read the node's key (``/etc/llmgw/node-key.pem`` on an installed node; the bundle's in
  the sim), the agent's environment, and another shard's secret file;
- list the node's weights store, read another model's weights in it by their path (an
  entry planted as a fetch leaves one: its group is given only to the shards that name
  it), and write to the weights it was given (read-only to it).

and from any host of the node (``ps``, which every user may run): find a replica's secret
on an engine's command line.

A row is blocked when the kernel refused (Permission denied); an attempt that could not
be made at all is ``ALLOWED`` with what stopped it, so a broken attempt never reads as a
wall that holds.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import psutil

from agent_worker.weights.access import restrict
from agent_worker.weights.names import cache_name
from bench import sim
from bench.hostile.rows import Row
from bench.hostile.scene import Rank, Scene
from llmgw_cli.sim.state import Fleet

SHARD_FILES = Path("/run/llmgw/shards")


def attempts(fleet: Fleet, scene: Scene) -> Iterator[Row]:
    for rank in scene.ranks:
        yield from as_engine(fleet, scene, rank)
    yield secrets_on_command_lines(fleet, scene)


def as_engine(fleet: Fleet, scene: Scene, rank: Rank) -> Iterator[Row]:
    who = f"{rank.model} rank {rank.rank}'s engine"
    identity = engine_identity(rank.pid)
    if identity is None:
        yield Row(f"act as {who}", rank.node, False, f"its process (pid {rank.pid}) is gone")
        return
    uid, gid, groups = identity
    yield runs_as_root(rank, who)
    env = fleet.env[rank.node]
    others = [r for r in scene.ranks if r.shard != rank.shard]
    targets = [
        ("read the node's key", Path(env["LLMGW_AGENT_KEY"])),
        ("read /etc/llmgw/node-key.pem", Path("/etc/llmgw/node-key.pem")),
        ("read the agent's environment", Path(f"/proc/{fleet.pid(rank.node, 'agent')}/environ")),
        ("list the node's weights store", Path(env["LLMGW_WEIGHTS_DIR"])),
    ]
    targets += [(f"read {o.model} rank {o.rank}'s secret file", SHARD_FILES / o.shard / "api-key")
                for o in others if o.serves_http][:1]  # fmt: skip
    targets.append(("read another model's weights by their path", other_models_weights(env)))
    for what, path in targets:
        if what.startswith("read /etc") and not path.exists():
            continue  # a simulated node keeps its key in its bundle: the row above
        reader = "/bin/ls" if path.is_dir() else "/bin/cat"  # the store: list it
        yield attempt(f"{what} as {who}", rank.node, uid, gid, groups, [reader, str(path)])
    weights = model_path(rank.pid)
    if weights:
        yield attempt(f"write to its own weights as {who}", rank.node, uid, gid, groups,
                      ["/bin/sh", "-c", ': >> "$1"', "sh", weights])  # fmt: skip


def other_models_weights(env: dict[str, str]) -> Path:
    """A file in the node's store as a fetch of a model no shard here serves leaves it."""
    store = Path(env["LLMGW_WEIGHTS_DIR"])
    path = store / cache_name("https://models.example/another-teams-model.gguf")
    if not path.exists():
        store.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"GGUF another team's fine-tune\n")
        restrict(path)
    return path


def runs_as_root(rank: Rank, who: str) -> Row:
    """Whether any process of the engine's group (rpc-server, llama-server and its
    children) runs as root."""
    try:
        pgid = _pgid(rank.pid) if rank.pid else 0
        group = [p for p in psutil.process_iter(["pid"]) if _pgid(p.pid) == pgid]
        uids = sorted({p.uids().real for p in group})
    except psutil.Error as exc:
        return Row(f"{who} runs as root", rank.node, False, f"cannot look: {exc}")
    blocked = bool(uids) and 0 not in uids
    said = f"{len(group)} process(es) of its group run as uid {', '.join(map(str, uids))}"
    return Row(f"{who} runs as root", rank.node, blocked, said)


def attempt(what: str, node: str, uid: int, gid: int, groups: list[int], argv: list[str]) -> Row:
    try:
        done = subprocess.run(argv, user=uid, group=gid, extra_groups=groups, timeout=30,
                              capture_output=True, check=False)  # fmt: skip
    except (OSError, subprocess.SubprocessError) as exc:
        return Row(what, node, False, f"the attempt could not be made: {exc}")
    said = done.stderr.decode(errors="replace").strip().splitlines()
    if done.returncode != 0 and said and "Permission denied" in said[-1]:
        return Row(what, node, True, said[-1][-120:])
    if done.returncode != 0:
        return Row(what, node, False, f"failed, but not refused: {said[-1:] or done.returncode}")
    return Row(what, node, False, f"done: {len(done.stdout)} bytes read")


def secrets_on_command_lines(fleet: Fleet, scene: Scene) -> Row:
    """Every replica's secret looked for on every command line of the machine, as ``ps``
    shows them to any user."""
    replicas = sorted({rank.replica for rank in scene.ranks})
    rows = sim.query(fleet, "SELECT secret FROM fleet_replica WHERE id::text = ANY(%s)",
                     (replicas,))  # fmt: skip
    secrets = [secret for (secret,) in rows if secret]
    if not secrets:
        return Row("read an engine's secret from ps", "any", False, "no replica secret to look for")
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        line = " ".join(proc.info["cmdline"] or [])
        if any(secret in line for secret in secrets):
            found.append(proc.info["pid"])
    if found:
        return Row(
            "read an engine's secret from ps", "any", False, f"on the command line of pids {found}"
        )
    checked = len(list(psutil.pids()))
    return Row("read an engine's secret from ps", "any", True,
               f"none of {len(secrets)} replica secrets on {checked} command lines")  # fmt: skip


def engine_identity(pid: int | None) -> tuple[int, int, list[int]] | None:
    """(uid, gid, supplementary groups) of ``pid``, as the kernel holds them."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines() if pid else []
    except OSError:
        return None
    fields = {line.split(":")[0]: line.split(":", 1)[1].split() for line in lines if ":" in line}
    if "Uid" not in fields:
        return None
    return int(fields["Uid"][0]), int(fields["Gid"][0]), [int(g) for g in fields.get("Groups", [])]


def model_path(pid: int | None) -> str:
    """The ``-m`` of llama-server ``pid``; "" for a process without one (rpc-server)."""
    try:
        argv = psutil.Process(pid).cmdline() if pid else []
    except psutil.Error:
        return ""
    for index, arg in enumerate(argv[:-1]):
        if arg in ("-m", "--model"):
            return argv[index + 1]
    return ""


def _pgid(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[2])
    except (OSError, IndexError, ValueError):
        return -1
