"""Run Python code in a fresh interpreter with umask 0, watching the modes of given files.

After every audited operation (open, chmod, link, rename, remove...) each watched path
that exists has its mode recorded, so a file that was ever wider than 0600, even for the
moment between a write and a chmod, shows up in what the child prints.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

CHILD = r"""
import json, os, stat, sys

watched = json.loads(sys.argv[1])
seen = {path: [] for path in watched}
busy = False

def record(event, args):
    global busy
    if busy:
        return
    busy = True
    try:
        for path in watched:
            try:
                seen[path].append(stat.S_IMODE(os.lstat(path).st_mode))
            except OSError:
                pass
    finally:
        busy = False

sys.addaudithook(record)
os.umask(0)
exec(sys.argv[2])
record("end", ())
print("SEEN " + json.dumps(seen))
"""


def run_watching(code: str, watched: list[Path], env: dict[str, str]) -> dict[str, list[int]]:
    """Run ``code`` with umask 0; every mode each watched path had while it existed."""
    result = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps([str(p) for p in watched]), code],
        cwd=REPO, env={**os.environ, **env}, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    line = next(line for line in result.stdout.splitlines() if line.startswith("SEEN "))
    return json.loads(line[len("SEEN ") :])


def settings_env(home: Path) -> dict[str, str]:
    """Enough environment to import llmgw_site.settings without starting any server."""
    return {
        "LLMGW_HOME": str(home),
        "SECRET_KEY": "",
        "DATABASE_URL": "postgresql://nobody@127.0.0.1:1/nothing",
        "REDIS_URL": "redis://127.0.0.1:1/0",
    }
