"""bench/budgets.py shortened (issue 41's proof): a key's day budget spent through two
routers while Redis and a router are killed with SIGKILL. Invariants only, never timings:
no usage row lost, the overshoot at most one reservation, the key without limits never
refused."""

from __future__ import annotations

import subprocess
import sys

import pytest
from django.conf import settings

from tests.processes.support import REPO

pytestmark = pytest.mark.process


def test_the_short_bench_keeps_the_budget_and_every_usage_row():
    database = f"{settings.DATABASES['default']['NAME']}_budgets"
    run = subprocess.run(
        [sys.executable, "-m", "bench.budgets", "--short", "--database", database],
        cwd=REPO, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    report = run.stdout[-4000:] + run.stderr[-4000:]
    assert run.returncode == 0, report
    header, _rule, row = run.stdout.strip().splitlines()[-3:]
    figures = dict(zip(header.split(" | "), row.split(" | "), strict=True))
    assert int(figures["lost rows"]) == 0, report
    assert int(figures["overshoot"]) <= int(figures["one reservation"]), report
    assert int(figures["other key refused"]) == 0, report
    assert int(figures["refused after exhaustion"]) > 0, report  # the budget did bite
