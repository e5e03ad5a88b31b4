"""The control plane's and the router's processes collect garbage rarely, with start-up's
objects frozen."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# Run in a process of its own: importing asgi here would change the collector of every
# test after this one in the same worker.
PROBE = """
import gc, json
from {module} import asgi
print(json.dumps({{"threshold": gc.get_threshold(), "frozen": gc.get_freeze_count()}}))
"""


def collector_of(module: str, env: dict[str, str] | None = None) -> dict:
    run = subprocess.run(
        [sys.executable, "-c", PROBE.format(module=module)], cwd=REPO, capture_output=True,
        text=True, timeout=120, env={**os.environ, **(env or {})},
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_the_control_plane_collects_rarely_and_freezes_what_start_up_made():
    seen = collector_of("llmgw_site")
    assert seen["threshold"][0] > 700 * 10  # far above CPython's default
    assert seen["frozen"] > 0


def test_the_router_collects_rarely_and_freezes_what_start_up_made(tmp_path):
    static = tmp_path / "static.yaml"
    static.write_text("models: []\nauth: false\n")
    seen = collector_of("router", {"LLMGW_ROUTER_STATIC": str(static)})
    assert seen["threshold"][0] > 700 * 10
    assert seen["frozen"] > 0
