"""The pages and their actions over HTTP: who may see what, and what each shows."""

from __future__ import annotations

import json

import pytest
from django.test import Client

from audit.models import Event
from catalog.models import Profile
from fleet import commands
from fleet.models import Node, Replica, ReplicaState
from tests.pages.rows import heartbeating_node, stale_replica_on

pytestmark = pytest.mark.django_db


@pytest.fixture
def fleet():
    node = heartbeating_node("node01")
    profile, stale, fetching, unplaceable = stale_replica_on(node)
    return {"node": node, "profile": profile, "stale": stale, "fetching": fetching}


@pytest.fixture
def answering_agent(monkeypatch):
    """read_logs as an agent answers it; the real round trip is in test_live_pages."""
    asked = []

    def read_logs(node_id, source="agent", lines=200):
        asked.append((node_id, source, lines))
        return {"lines": [f"{source} line {i}" for i in range(3)], "sources": ["agent", "abc"]}

    monkeypatch.setattr(commands, "read_logs", read_logs)
    return asked


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def pages(fleet) -> list[str]:
    return ["/", "/nodes/node01/", "/nodes/node01/logs/", "/models/gemma/"]


def actions(fleet) -> list[tuple[str, dict]]:
    return [
        ("/nodes/node01/drain/", {}),
        ("/nodes/node01/undrain/", {}),
        (f"/replicas/{fleet['stale'].id}/restart/", {}),
        (f"/profiles/{fleet['profile'].id}/scale/", {"replicas": "3"}),
    ]


def test_anonymous_visitors_are_sent_to_sign_in_for_every_page_and_action(fleet):
    client = Client()
    for url in pages(fleet):
        response = client.get(url)
        assert response.status_code == 302, url
        assert response["Location"].startswith("/accounts/login/?next="), url
    for url, data in actions(fleet):
        response = client.post(url, data)
        assert response.status_code == 302, url
        assert response["Location"].startswith("/accounts/login/"), url
    assert not Node.objects.get(id="node01").draining


def test_a_reader_sees_every_page_without_buttons(fleet, reader, answering_agent):
    client = signed_in(reader)
    for url in pages(fleet):
        response = client.get(url)
        assert response.status_code == 200, url
        html = response.content.decode()
        assert 'class="action"' not in html, url
        assert "hx-post" not in html, url


def test_a_reader_is_refused_every_action(fleet, reader):
    client = signed_in(reader)
    for url, data in actions(fleet):
        response = client.post(url, data)
        assert response.status_code == 403, url
        assert "operator role" in response.content.decode()
    assert not Node.objects.get(id="node01").draining
    assert Replica.objects.get(id=fleet["stale"].id).state == ReplicaState.READY
    assert Profile.objects.get(id=fleet["profile"].id).replicas == 2


def test_actions_take_post_only(fleet, operator):
    client = signed_in(operator)
    for url, _data in actions(fleet):
        assert client.get(url).status_code == 405, url


def test_an_operator_sees_the_buttons(fleet, operator):
    client = signed_in(operator)
    html = client.get("/").content.decode()
    assert f'hx-post="/replicas/{fleet["stale"].id}/restart/"' in html
    html = client.get("/nodes/node01/").content.decode()
    assert 'hx-post="/nodes/node01/drain/"' in html
    html = client.get("/models/gemma/").content.decode()
    assert f'hx-post="/profiles/{fleet["profile"].id}/scale/"' in html


def test_an_operator_drains_a_node_and_returns_it(fleet, operator):
    client = signed_in(operator)
    response = client.post("/nodes/node01/drain/", headers={"HX-Request": "true"})
    assert response.status_code == 204
    assert json.loads(response["HX-Trigger"]) == {"llmgw-done": "node01 is draining"}
    assert Node.objects.get(id="node01").draining
    assert Event.objects.filter(subject="node01", reason="drained", actor=operator).exists()
    response = client.post("/nodes/node01/undrain/", headers={"Referer": "/nodes/node01/"})
    assert response.status_code == 302 and response["Location"] == "/nodes/node01/"
    assert not Node.objects.get(id="node01").draining


def test_an_operator_restarts_a_stale_replica(fleet, operator):
    client = signed_in(operator)
    response = client.post(
        f"/replicas/{fleet['stale'].id}/restart/", headers={"HX-Request": "true"}
    )
    assert response.status_code == 204
    assert Replica.objects.get(id=fleet["stale"].id).state == ReplicaState.STOPPING
    event = Event.objects.get(subject=str(fleet["stale"].id), to_state="stopping")
    assert event.reason == "restart requested" and event.actor == operator
    assert event.description == "restart requested by olga"


def test_an_operator_scales_a_profile(fleet, operator):
    client = signed_in(operator)
    url = f"/profiles/{fleet['profile'].id}/scale/"
    assert client.post(url, {"replicas": "3"}, headers={"HX-Request": "true"}).status_code == 204
    assert Profile.objects.get(id=fleet["profile"].id).replicas == 3
    event = Event.objects.get(subject="gemma/cpu")
    assert event.reason == "scaled from 2 to 3 replicas" and event.actor_name == "olga"
    response = client.post(url, {"replicas": "-1"})
    assert response.status_code == 400
    assert "whole number" in response.content.decode()


def test_actions_on_missing_rows_are_404(operator):
    client = signed_in(operator)
    assert client.post("/nodes/nope/drain/").status_code == 404
    missing = "00000000-0000-0000-0000-000000000000"
    assert client.post(f"/replicas/{missing}/restart/").status_code == 404
    assert client.post("/profiles/999999/scale/", {"replicas": "1"}).status_code == 404
    assert client.get("/nodes/nope/").status_code == 404
    assert client.get("/models/nope/").status_code == 404


def test_the_cluster_page_shows_nodes_and_models_as_operators_need_them(fleet, reader):
    html = signed_in(reader).get("/").content.decode()
    assert 'id="node-node01"' in html and 'data-state="connected"' in html
    assert 'href="/nodes/node01/"' in html
    assert "41%" in html  # CPU bar label
    assert "14.9 GiB / 59.6 GiB" in html  # RAM bar label
    assert "11.2 GiB / 80 GiB" in html  # GPU memory used / total
    assert "vllm 0.9 failed: vllm-0.9.tar.gz: sha256 mismatch" in html
    assert "186.3 GiB" in html  # disk free where the weights go
    assert "no AVX2: llama.cpp runs slowly" in html
    assert "fabric ib0: adapter mlx5_0 is DOWN" in html
    assert "1 / 2" in html  # ready / wanted
    assert "stale: a rolling restart replaces it" in html
    assert "downloading: 2.9 of 14.2 GiB, 39 MiB/s" in html
    assert "node01: needs 80 GB of GPU memory, has 68 GB free" in html
    assert 'href="/models/gemma/#replica-' in html


def test_htmx_asks_for_one_fragment(fleet, reader):
    client = signed_in(reader)
    response = client.get("/?fragment=models", headers={"HX-Request": "true"})
    html = response.content.decode()
    assert html.lstrip().startswith('<section id="models">')
    assert "<header>" not in html


def test_the_model_page_says_what_each_profile_serves(fleet, reader):
    html = signed_in(reader).get("/models/gemma/").content.decode()
    assert '<div class="muted serves">serves chat</div>' in html
    fleet["profile"].serves = ["embeddings"]
    fleet["profile"].save()
    html = signed_in(reader).get("/models/gemma/").content.decode()
    assert '<div class="muted serves">serves embeddings</div>' in html


def test_the_node_page_shows_what_runs_there(fleet, reader):
    usage = dict(fleet["node"].usage)
    shard = fleet["stale"].shards.get()
    usage["shards"] = {shard.id: {"cpu_cores": 3.5, "rss": 9 * 10**9}}
    Node.objects.filter(id="node01").update(usage=usage)
    html = signed_in(reader).get("/nodes/node01/").content.decode()
    assert 'id="node-summary"' in html and 'id="node-history"' in html
    assert "3.50" in html and "8.4 GiB" in html
    assert "Router queue depth" in html and "no data yet" in html
    assert 'ws-connect="/ws/pages/nodes/node01/"' in html


def test_the_logs_page_reads_the_agent(fleet, reader, answering_agent):
    client = signed_in(reader)
    html = client.get("/nodes/node01/logs/?source=agent&n=50").content.decode()
    assert "agent line 2" in html
    assert answering_agent == [("node01", "agent", 50)]
    assert '<option value="abc"' in html
    html = client.get(
        "/nodes/node01/logs/?source=abc&n=5&follow=1&fragment=lines", headers={"HX-Request": "true"}
    ).content.decode()
    assert html.lstrip().startswith('<section id="log-lines"')
    assert 'hx-trigger="every 5s"' in html and "abc line 0" in html
    assert client.get("/nodes/node01/logs/?source=../etc").status_code == 400
    assert client.get("/nodes/node01/logs/?n=lots").status_code == 400


def test_the_logs_page_says_when_the_agent_does_not_answer(fleet, reader, monkeypatch):
    def silent(node_id, source="agent", lines=200):
        raise commands.AgentDidNotAnswer(
            f"the agent on {node_id} did not answer in 10 s (too old or unreachable)"
        )

    monkeypatch.setattr(commands, "read_logs", silent)
    html = signed_in(reader).get("/nodes/node01/logs/").content.decode()
    assert "did not answer in 10 s (too old or unreachable)" in html
    # The node's shards are still offered as sources.
    assert f'<option value="{fleet["stale"].shards.get().id}"' in html


def test_a_model_that_left_the_catalog_still_shows_its_replicas(fleet, reader):
    fleet["profile"].model.delete()
    html = signed_in(reader).get("/models/gemma/").content.decode()
    assert "no longer in the catalog" in html
    assert f'id="replica-{fleet["stale"].id}"' in html


def test_a_draining_replica_says_so_on_the_model_page(fleet, reader):
    from django.utils import timezone

    from fleet.models import Replica

    replica = Replica.objects.filter(model_name="gemma").first()
    Replica.objects.filter(id=replica.id).update(draining_since=timezone.now())
    html = signed_in(reader).get("/models/gemma/").content.decode()
    assert "draining: finishing its requests" in html
    assert html.count("draining: finishing its requests") == 1
