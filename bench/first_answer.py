"""The first answer after `git clone`: how long a new user waits, and where the time goes.

Run: python -m bench.first_answer [--runs 2] [--keep]     (or python bench/first_answer.py)

Clones this repository's committed HEAD into a temporary directory, points pip's cache,
llmgw's wheel cache and LLMGW_HOME at empty directories there, runs `make run` on free
ports, and asks the router for a streamed answer from the demo model until the first token
arrives. It prints the seconds from the clone to that token, and `llmgw up`'s own table of
stages (install, services, migrate, setup, link, engine install, weights, engine ready,
first answer). The first run is cold (empty caches, nothing built); each later run is
`make run` again in the same clone, caches and home: warm. After each run it stops
`llmgw up` with Ctrl-C (SIGINT), as a user would, and checks that it said so.

Only the standard library: it runs under any Python 3.11, before anything is installed.
The package index is whatever pip is configured with here (printed first): that is the
"package index reachable" condition the numbers hold under.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MODEL = "smollm2-135m"
# `llmgw up`'s table: "  engine install     6.1 s  the node installed ..."
STAGE_LINE = re.compile(r"^  (\S.*?) +(\d+\.\d) s  ", re.MULTILINE)
TABLE_HEADER = "where the time went"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f}, {five:.2f}, {fifteen:.2f} on {os.cpu_count()} cores"


def first_token(router_url: str, key: str) -> bool:
    """One streamed chat request through the router; True once a token has arrived."""
    body = json.dumps({"model": MODEL, "stream": True, "max_tokens": 4,
                       "messages": [{"role": "user", "content": "Hello!"}]}).encode()  # fmt: skip
    request = urllib.request.Request(  # noqa: S310 (an http:// URL on loopback)
        f"{router_url}/v1/chat/completions", data=body, method="POST",
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310 (loopback)
            for raw in response:
                line = raw.decode("utf-8", "replace").strip()
                if line.startswith("data: {"):
                    choice = (json.loads(line[6:]).get("choices") or [{}])[0]
                    if (choice.get("delta") or {}).get("content") or choice.get("finish_reason"):
                        return True
    except (urllib.error.URLError, OSError, ValueError):
        return False
    return False


class Workspace:
    """The clone, its empty caches and home, and the environment `make run` gets."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.clone = root / "llmgw"
        self.home = root / "home"
        self.router_port = free_port()
        env = {name: value for name, value in os.environ.items()
               if not name.startswith("LLMGW_") and name not in
               ("DATABASE_URL", "REDIS_URL", "VIRTUAL_ENV", "PYTHONPATH")}  # fmt: skip
        env.update(
            PIP_CACHE_DIR=str(root / "pip-cache"), XDG_CACHE_HOME=str(root / "xdg-cache"),
            LLMGW_WHEEL_CACHE=str(root / "wheels"), LLMGW_HOME=str(self.home),
            LLMGW_PORT=str(free_port()), LLMGW_ROUTER_PORT=str(self.router_port),
            LLMGW_ENGINE_PORT_BASE=str(free_port()), PYTHONUNBUFFERED="1",
        )  # fmt: skip
        self.env = env

    @property
    def router_url(self) -> str:
        return f"http://127.0.0.1:{self.router_port}"


def make_run(space: Workspace, log: Path, timeout: float) -> dict[str, object]:
    """`make run` until the first streamed token, then Ctrl-C; what it took."""
    started = time.time()
    with log.open("wb") as out:
        make = subprocess.Popen(["make", "run"], cwd=space.clone, env=space.env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    key_file, answered = space.home / "api-key", None
    try:
        while time.time() - started < timeout and make.poll() is None:
            key = key_file.read_text().strip() if key_file.exists() else ""
            if key and first_token(space.router_url, key):
                answered = time.time()
                break
            time.sleep(0.25)
        # `llmgw up` prints its table once it has seen an answer of its own.
        deadline = time.time() + 60
        while answered and TABLE_HEADER not in log.read_text(errors="replace"):
            if time.time() > deadline or make.poll() is not None:
                break
            time.sleep(0.5)
    finally:
        stopped = stop(make)
    output = log.read_text(errors="replace")
    table = output[output.find(TABLE_HEADER) :] if TABLE_HEADER in output else ""
    return {
        "make_run_to_answer": None if answered is None else answered - started,
        "stages": [(name, float(seconds)) for name, seconds in STAGE_LINE.findall(table)],
        "stopped_cleanly": stopped and "llmgw stopped" in output,
        "ran_apt_get": "apt-get" in output,
    }


def stop(make: subprocess.Popen) -> bool:
    """Ctrl-C to `make run`'s process group; True if it ended within a minute."""
    if make.poll() is not None:
        return True
    os.killpg(make.pid, signal.SIGINT)
    try:
        make.wait(timeout=60)
        return True
    except subprocess.TimeoutExpired:
        os.killpg(make.pid, signal.SIGKILL)
        make.wait()
        return False


def pip_sources(env: dict[str, str]) -> str:
    """Where pip looks for packages here: its configuration as pip itself reads it."""
    listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"], env=env,
                            capture_output=True, text=True, check=False)  # fmt: skip
    lines = [line for line in listed.stdout.splitlines()
             if re.search(r"index-url|find-links|constraint", line)]  # fmt: skip
    return "; ".join(lines) or "pip's defaults (https://pypi.org/simple)"


def report(number: int, kind: str, clone: float | None, result: dict, before: str) -> None:
    waited = result["make_run_to_answer"]
    print(f"\nrun {number} ({kind}); before: {before}; after: {load()}")
    if waited is None:
        print("  no answer: see the log")
        return
    total = waited + (clone or 0.0)
    if clone is not None:
        print(f"  git clone                {clone:6.1f} s")
    print(f"  make run → first token   {waited:6.1f} s")
    print(f"  total                    {total:6.1f} s")
    for name, seconds in result["stages"]:
        print(f"    {name:<20} {seconds:6.1f} s")
    print(f"  stopped cleanly: {result['stopped_cleanly']}; apt-get run: {result['ran_apt_get']}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2, help="the first cold, the rest warm")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds a run may take")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    options = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="llmgw-first-answer-"))
    space = Workspace(root)
    print(f"in {root}; pip reads: {pip_sources(space.env)}")
    try:
        before = load()
        started = time.time()
        subprocess.run(["git", "clone", "--quiet", str(REPO), str(space.clone)], check=True)
        cloned = time.time() - started
        for number in range(1, options.runs + 1):
            before = before if number == 1 else load()
            log = root / f"make-run-{number}.log"
            result = make_run(space, log, options.timeout)
            kind = "cold: empty caches, fresh clone" if number == 1 else "warm: same clone"
            report(number, kind, cloned if number == 1 else None, result, before)
            print(f"  log: {log}")
    finally:
        if not options.keep:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
