"""Where the time of a first start went: ``llmgw up`` asks its router for the demo model's
first streamed answer, and once it has one prints each stage from `make run` to it.

``llmgw up`` times what it does itself (the services, migrate, its set-up) and the
install before it (``LLMGW_INSTALL_STARTED``, which `make run` sets). What the fleet did
(the agent linking, the engine installing, the weights, the engine starting) is read
afterwards from what the control plane recorded: the node's registration and engine
change times, and the shard's transitions. Run as ``python -m llmgw_cli.startup_report``
by ``llmgw up`` once answered, so that Django is loaded only after the clock has stopped.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from collections.abc import Callable
from datetime import datetime

import httpx

# stage -> what it covers, in the order they happen; each ends where the next begins.
STAGES = {
    "install": "venv and pip install (make)",
    "services": "embedded PostgreSQL and Redis",
    "migrate": "database migrations",
    "setup": "admin, node certificate, demo catalog, API key",
    "link": "processes started, the local agent linked",
    "engine install": "the node installed the demo's engine",
    "weights": "replica placed, its weights found",
    "engine ready": "the engine loaded the model and answers",
    "first answer": "first streamed token through the router",
}
# How long `llmgw up` waits for the demo's first answer before saying so and giving up.
ANSWER_PATIENCE = 600.0


def first_streamed_token(router_url: str, key: str, model: str) -> bool:
    """Ask the router for a short streamed answer; True once a token arrives."""
    body = {"model": model, "stream": True, "max_tokens": 4,
            "messages": [{"role": "user", "content": "Hello!"}]}  # fmt: skip
    headers = {"Authorization": f"Bearer {key}"}
    try:
        with httpx.stream("POST", f"{router_url}/v1/chat/completions", json=body,
                          headers=headers, timeout=30) as response:  # fmt: skip
            if response.status_code != 200:
                return False
            for line in response.iter_lines():
                if not line.startswith("data: {"):
                    continue
                choices = json.loads(line.removeprefix("data: ")).get("choices") or [{}]
                delta = choices[0].get("delta") or {}
                if delta.get("content") or choices[0].get("finish_reason"):
                    return True
    except (httpx.HTTPError, ValueError):
        return False
    return False


def wait_for_first_answer(
    ask: Callable[[], bool], patience: float = ANSWER_PATIENCE, pause: float = 0.25
) -> float | None:
    """Ask until answered; the wall-clock time it was, or None past ``patience`` seconds."""
    deadline = time.monotonic() + patience
    while time.monotonic() < deadline:
        if ask():
            return time.time()
        time.sleep(pause)
    return None


def fleet_marks(since: float, model: str, node_id: str) -> dict[str, float]:
    """When the fleet's stages ended (wall-clock seconds), from what the control plane
    recorded since ``since``: the node linked, its engines last changed, the model's first
    shard started and was ready."""
    from audit.models import Event, EventKind
    from fleet.models import Node, Shard

    marks: dict[str, float] = {}
    node = Node.objects.filter(id=node_id).first()
    if node is not None and node.registered_at is not None:
        marks["link"] = node.registered_at.timestamp()
        changed = node.engines_changed_at
        marks["engine install"] = max(marks["link"], changed.timestamp() if changed else 0)
    shards = Shard.objects.filter(replica__model_name=model).values_list("id", flat=True)
    events = Event.objects.filter(
        kind=EventKind.SHARD, subject__in=list(shards), at__gte=_moment(since)
    ).order_by("at")
    for event in events:
        stage = {"starting": "weights", "ready": "engine ready"}.get(event.to_state)
        if stage and stage not in marks:
            marks[stage] = event.at.timestamp()
    return marks


def durations(marks: dict[str, float], started: float) -> list[tuple[str, float]]:
    """Each stage's seconds from the time its predecessor ended (``started`` for the
    first); a stage without a mark is left out, and the next counts from the last one."""
    rows, previous = [], started
    for stage in STAGES:
        if stage in marks:
            end = max(marks[stage], previous)
            rows.append((stage, end - previous))
            previous = end
    return rows


def render(rows: list[tuple[str, float]]) -> str:
    """The table ``llmgw up`` prints, one stage a line, and the total."""
    total = sum(seconds for _stage, seconds in rows)
    lines = [f"first answer {total:.1f} s after the start; where the time went:"]
    lines += [f"  {stage:<15}{seconds:7.1f} s  {STAGES[stage]}" for stage, seconds in rows]
    return "\n".join(lines)


def _moment(epoch: float) -> datetime:
    from django.utils import timezone

    return datetime.fromtimestamp(epoch, tz=timezone.get_current_timezone())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--marks", required=True, help="JSON: stage -> when it ended")
    parser.add_argument("--started", type=float, required=True)
    parser.add_argument("--model", required=True)
    options = parser.parse_args(argv)
    import django

    django.setup()
    marks = json.loads(options.marks)
    node_id = os.environ.get("LLMGW_NODE_ID") or socket.gethostname()
    since = marks.get("setup", options.started)
    marks.update({k: v for k, v in fleet_marks(since, options.model, node_id).items()})
    print(render(durations(marks, options.started)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
