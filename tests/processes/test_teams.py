"""Teams through real routers (issue 43's proof): two teams, a model open to one of them;
the other team's key gets 404 ``model_not_found`` naming only its own models, and does not
see the model in ``/v1/models``; a team's day budget, shared by two keys spending through
two router processes, stops both, and the refusal names the team. Another team's key is
served throughout.

Real PostgreSQL and Redis, two uvicorn routers, one fake engine (tests/router/
fake_engine.py) behind ready replicas of both models. Invariants only, never timings.
"""

from __future__ import annotations

import sys
import uuid

import httpx
import pytest

from audit.actors import SystemActor
from catalog.actions.api_keys import create_key
from catalog.models import Model, Profile
from catalog.teams.actions import create_team, open_model
from fleet.models import Node, Replica, ReplicaState, Shard, ShardState
from tests.processes.support import REPO, Process, base_env, router
from tests.support.polling import wait_until
from tests.support.ports import free_port

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

ACTOR = SystemActor("teams process test")
SECRET = "engine-secret"  # noqa: S105 (the fake engine's, for this test alone)
BUDGET = 200  # the red team's tokens per day, for both its keys together


def serve_models(port: int, names: list[str]) -> None:
    """Each model on one ready replica of the fake engine at ``port``."""
    node, _ = Node.objects.get_or_create(id="teams-node", defaults={"address": "127.0.0.1"})
    for name in names:
        model = Model.objects.create(name=name, source=f"/models/{name}.gguf")
        profile = Profile.objects.create(model=model, name="cpu", engine="llama.cpp", replicas=1)
        replica = Replica.objects.create(
            model_name=name, profile_name="cpu", profile=profile, state=ReplicaState.READY,
            fingerprint=profile.fingerprint(), secret=SECRET,
        )  # fmt: skip
        Shard.objects.create(id=Shard.new_id(), replica=replica, rank=0, node=node, port=port,
                             state=ShardState.READY)  # fmt: skip


def chat(client: httpx.Client, url: str, key: str, model: str) -> httpx.Response:
    return client.post(
        f"{url}/v1/chat/completions", headers={"Authorization": f"Bearer {key}"},
        json={"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8},
    )  # fmt: skip


def listed(client: httpx.Client, url: str, key: str) -> list[str]:
    answer = client.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {key}"})
    return sorted(entry["id"] for entry in answer.json()["data"])


def test_a_model_closed_to_a_team_and_a_team_budget_across_two_routers(processes, tmp_path):
    engine_port = free_port()
    engine = Process("engine", [sys.executable, str(REPO / "tests" / "router" / "fake_engine.py"),
                                "--port", str(engine_port), "--api-key", SECRET, "--no-record"],
                     base_env(), tmp_path).start()  # fmt: skip
    processes.append(engine)
    serve_models(engine_port, ["open-model", "red-model"])
    run = uuid.uuid4().hex[:6]  # the teams' Redis counters are this run's alone
    red, blue = f"red-{run}", f"blue-{run}"
    create_team(red, limits={"tokens_per_day": BUDGET}, actor=ACTOR)
    create_team(blue, actor=ACTOR)
    open_model("red-model", [red], actor=ACTOR)
    _row, red_a = create_key("red-a", team=red, actor=ACTOR)
    _row, red_b = create_key("red-b", team=red, actor=ACTOR)
    _row, blue_key = create_key("blue-a", team=blue, actor=ACTOR)

    urls = []
    for index in range(2):
        port = free_port()
        table = str(tmp_path / f"table-{index}.json")
        processes.append(router(port, tmp_path, LLMGW_ROUTER_TABLE_FILE=table).start())
        urls.append(f"http://127.0.0.1:{port}")
    with httpx.Client(timeout=30) as client:
        for url in urls:  # each router has loaded both models' ready replicas and the keys
            wait_until(lambda url=url: _lists(client, url, red_a) == ["open-model", "red-model"],
                       timeout=60, what=f"router {url} to serve both models")  # fmt: skip

        # The model closed to blue does not exist for blue's key, on either router.
        for url in urls:
            assert listed(client, url, blue_key) == ["open-model"]
            closed = chat(client, url, blue_key, "red-model")
            assert closed.status_code == 404, closed.text
            error = closed.json()["error"]
            assert error["code"] == "model_not_found"
            # Its own models only: the closed one is named as what was asked for, nowhere else.
            assert error["message"].endswith("does not exist; known models: open-model.")
            assert (
                client.get(
                    f"{url}/v1/models/red-model", headers={"Authorization": f"Bearer {blue_key}"}
                ).status_code
                == 404
            )
        first = chat(client, urls[0], red_a, "red-model")
        assert first.status_code == 200, first.text

        # Red's day budget, spent by its two keys through the two routers, stops both: a
        # round where each key is refused on its router once the budget is spent. (A refusal
        # may come a little early while a router has not settled its last answer yet: that
        # answer's reservation counts until then.)
        spent = largest = first.json()["usage"]["total_tokens"]
        refused: dict[str, httpx.Response] = {}
        for _round in range(100):
            refused = {}
            for key, url in ((red_a, urls[0]), (red_b, urls[1])):
                answer = chat(client, url, key, "open-model")
                if answer.status_code == 429:
                    refused[key] = answer
                    continue
                assert answer.status_code == 200, answer.text
                used = answer.json()["usage"]["total_tokens"]
                spent, largest = spent + used, max(largest, used)
            if len(refused) == 2 and spent >= BUDGET:
                break
        assert set(refused) == {red_a, red_b}, "the team's budget did not stop both keys"
        # Answered one at a time: the two keys together went over the budget by at most the
        # last answer admitted under it.
        assert spent < BUDGET + largest, (spent, largest)
        for key, answer in refused.items():
            error = answer.json()["error"]
            assert error["code"] == "insufficient_quota"
            name = "red-a" if key == red_a else "red-b"
            assert (
                f"Team {red} (key {name}) reached its budget of {BUDGET} tokens"
                in (error["message"])
            )
            assert answer.headers["x-llmgw-limited-by"] == "team"
        # Each router refuses both of red's keys now, and blue's key is served by both.
        for url in urls:
            for key in (red_a, red_b):
                assert chat(client, url, key, "open-model").status_code == 429
            assert chat(client, url, blue_key, "open-model").status_code == 200


def _lists(client: httpx.Client, url: str, key: str) -> list[str]:
    try:
        return listed(client, url, key)
    except (httpx.HTTPError, KeyError, ValueError):
        return []
