"""The control plane's process collects garbage rarely, with start-up's objects frozen."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# Run in a process of its own: importing asgi here would change the collector of every
# test after this one in the same worker.
PROBE = """
import gc, json
from llmgw_site import asgi
print(json.dumps({"threshold": gc.get_threshold(), "collect_after": asgi.COLLECT_AFTER,
                  "frozen": gc.get_freeze_count()}))
"""


def test_the_control_plane_collects_rarely_and_freezes_what_start_up_made():
    run = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr[-3000:]
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    assert tuple(seen["threshold"]) == tuple(seen["collect_after"])
    assert seen["collect_after"][0] > 700 * 10  # far above CPython's default
    assert seen["frozen"] > 0
