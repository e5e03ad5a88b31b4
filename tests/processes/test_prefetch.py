"""`llmgw_ctl weights fetch` through real agents: the model is fetched onto the node asked,
ahead of need, and placement then prefers that node for the model's replica."""

from __future__ import annotations

import functools
import http.server
import threading
import uuid
from io import StringIO

import pytest
from django.core.management import call_command

from catalog.actions.entries import apply_catalog
from catalog.actions.profiles import scale_profile
from catalog.models import Profile
from fleet.models import Node, Shard
from fleet.pki.tokens import node_token
from tests.factories import SETUP
from tests.processes.support import (
    agent,
    control_plane,
    fake_engines,
    free_port,
    listening,
    reconciler,
    wait_until,
)

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]


def test_a_model_fetched_ahead_of_need_draws_its_replica_to_that_node(processes, tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "tiny.gguf").write_bytes(b"GGUF" + bytes(256 * 1024))
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/tiny.gguf"
    port = free_port()
    env = {"LLMGW_LEADER_LEASE_KEY": f"llmgw:test-leader:{uuid.uuid4().hex[:8]}",
           "LLMGW_CONTROL_PLANE_ID": f"ws://127.0.0.1:{port}",
           "LLMGW_ENGINE_PORT_BASE": str(free_port()), "LLMGW_DEMO": "0"}  # fmt: skip
    processes.append(control_plane(port, tmp_path, **env).start())
    processes.append(reconciler("reconciler-prefetch", tmp_path, **env).start())
    wait_until(lambda: listening(port), 60, "the control plane")
    engines = fake_engines(tmp_path)
    suffix = uuid.uuid4().hex[:6]
    # Named so that, holding nothing, placement would pick the first.
    first, second = f"pf-a-{suffix}", f"pf-b-{suffix}"
    for node_id in (first, second):
        processes.append(
            agent(node_id, f"ws://127.0.0.1:{port}", node_token(node_id), tmp_path / node_id,
                  tmp_path, LLMGW_ENGINES=engines).start()
        )  # fmt: skip
    wait_until(lambda: Node.objects.filter(state="connected").count() == 2, 60,
             "both agents to register")  # fmt: skip
    apply_catalog(
        f"""
models:
  - name: tiny
    source: {url}
    profiles: [{{name: cpu, engine: llama.cpp, replicas: 0, memory: 16MiB}}]
""",
        actor=SETUP,
    )
    try:
        out = StringIO()
        call_command("llmgw_ctl", "weights", "fetch", "tiny", "--node", second, stdout=out)
        assert f"{second}: fetching {url}" in out.getvalue()
        wait_until(
            lambda: any(w["source"] == url for w in Node.objects.get(id=second).weights), 60,
            "the weights to be on the node asked",
        )  # fmt: skip
        assert not any(w["source"] == url for w in Node.objects.get(id=first).weights)

        scale_profile(Profile.objects.get(model__name="tiny").id, 1, actor=SETUP)
        shard = wait_until(lambda: Shard.objects.filter(node__isnull=False).first(), 60,
                         "the replica to be placed")  # fmt: skip
        assert shard.node_id == second
    finally:
        server.shutdown()
