"""The cluster page's nodes a page at a time: filters, counts and pages from the query
string, read in the database, at a cost that does not grow with the fleet."""

from __future__ import annotations

import re

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from fleet.models import Node
from fleet.pages.node_filter import NodeFilter
from fleet.selectors import node_counts
from tests.pages.rows import many_nodes

pytestmark = pytest.mark.django_db

ROW = re.compile(r'<tr id="node-([^"]+)"')


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def rows(html: str) -> list[str]:
    return ROW.findall(html)


def summary(html: str) -> str:
    """The line counting the fleet, as it reads."""
    found = re.search(r'<p class="node-counts">(.*?)</p>', html, re.S)
    return re.sub(r"<[^>]+>", "", found.group(1)) if found else ""


def page(client: Client, query: str = "") -> str:
    response = client.get(f"/?{query}" if query else "/", follow=True)
    assert response.status_code == 200, (query, response.status_code)
    return response.content.decode()


def test_the_cluster_page_costs_the_same_queries_for_5_nodes_as_for_60(operator):
    client = signed_in(operator)
    many_nodes(5)
    page(client)  # sessions, content types and the like, once
    with CaptureQueriesContext(connection) as few:
        assert len(rows(page(client))) == 5
    Node.objects.all().delete()
    many_nodes(60)
    with CaptureQueriesContext(connection) as many:
        assert len(rows(page(client))) == 50
    assert len(many.captured_queries) == len(few.captured_queries), [
        query["sql"] for query in many.captured_queries
    ]


def test_the_first_page_shows_50_nodes_and_counts_every_state(operator):
    many_nodes(120, unreachable_every=10, draining=("gpu00003",))
    html = page(signed_in(operator))
    assert rows(html) == [f"gpu{i:05d}" for i in range(50)]
    assert summary(html) == "120 nodes: 108 connected, 12 unreachable, 1 draining"
    link = '<a class="state-unreachable" data-state="unreachable" href="/?state=unreachable">'
    assert link in html
    assert "showing 1–50 of 120" in html and "page 1 of 3" in html
    assert 'href="/?page=2"' in html and "matching" not in html


def test_pages_follow_one_another_and_the_last_holds_the_rest(operator):
    many_nodes(120)
    client = signed_in(operator)
    assert rows(page(client, "page=2")) == [f"gpu{i:05d}" for i in range(50, 100)]
    html = page(client, "page=3")
    assert rows(html) == [f"gpu{i:05d}" for i in range(100, 120)]
    assert "showing 101–120 of 120" in html
    assert 'rel="prev" href="/?page=2"' in html and 'rel="next"' not in html


@pytest.mark.parametrize(
    ("query", "expected", "matched"),
    [
        ("state=unreachable", ["gpu00009", "gpu00019", "gpu00029", "gpu00039"], 4),
        ("state=draining", ["gpu00002"], 1),
        ("pool=a&state=unreachable", [], 0),
        ("pool=b&q=gpu0001", ["gpu00011", "gpu00013", "gpu00015", "gpu00017", "gpu00019"], 5),
        ("fabric=ib-3&q=gpu0000", ["gpu00003", "gpu00007"], 2),
        ("q=10.0.0.3", ["gpu00003", *(f"gpu000{i}" for i in range(30, 40))], 11),
        ("q=GPU0002", [f"gpu0002{i}" for i in range(10)], 10),
    ],
    ids=["state", "draining", "pool-and-state", "pool-and-search", "fabric", "address", "case"],
)
def test_filters_narrow_the_rows_in_the_database(operator, query, expected, matched):
    many_nodes(40, unreachable_every=10, draining=("gpu00002",))
    html = page(signed_in(operator), query)
    assert rows(html) == expected
    if matched:
        assert f"of {matched} matching" in html
    else:
        assert "No node matches this filter" in html and "none of 40 match" in html
    # The summary still counts the whole fleet; the socket is asked for the same view.
    assert summary(html).startswith("40 nodes: 36 connected, 4 unreachable, 1 draining")
    canonical = NodeFilter.from_query(query).query().replace("&", "&amp;")
    assert f'ws-connect="/ws/pages/cluster/?{canonical}"' in html


def test_the_filter_bar_offers_the_pools_and_fabrics_nodes_are_in(operator):
    many_nodes(8)
    html = page(signed_in(operator), "pool=b&fabric=ib-1")
    bar = re.search(r'<form class="node-filter".*?</form>', html, re.S).group(0)
    assert '<option value="b" selected>' in bar and '<option value="a">' in bar
    assert '<option value="ib-1" selected>' in bar and '<option value="ib-3">' in bar
    assert rows(html) == ["gpu00001", "gpu00005"]


@pytest.mark.parametrize(
    ("query", "says", "shown"),
    [
        ("page=abc", "page 'abc' is not a page number; showing the first", 50),
        ("page=0", "page '0' is not a page number; showing the first", 50),
        ("page=-2", "page '-2' is not a page number; showing the first", 50),
        ("page=99", "page 99 is past the last (2); showing the last", 10),
        (
            "state=bogus",
            "'bogus' is not a node state (choose connected, unreachable, lost or "
            "draining); showing all",
            50,
        ),  # fmt: skip
        ("state=%00&page=9999999999999999999999", "past the last", 10),
    ],
    ids=["words", "zero", "negative", "past-the-end", "bogus-state", "odd-bytes"],
)
def test_a_bad_query_says_so_and_shows_a_sane_page(operator, query, says, shown):
    many_nodes(60)
    html = page(signed_in(operator), query)
    notes = re.findall(r'<p class="warning node-note">(.*?)</p>', html)
    assert any(says in note.replace("&#x27;", "'") for note in notes), notes
    assert len(rows(html)) == shown


def test_control_characters_in_a_search_are_left_out(operator):
    many_nodes(12)
    html = page(signed_in(operator), "q=gpu0001%00&pool=%00b")
    assert rows(html) == ["gpu00011"]


def test_a_fleet_of_a_few_nodes_shows_no_pager(operator):
    many_nodes(3)
    html = page(signed_in(operator))
    assert rows(html) == ["gpu00000", "gpu00001", "gpu00002"]
    assert summary(html) == "3 nodes: 3 connected" and "node-pager" not in html
    assert 'ws-connect="/ws/pages/cluster/"' in html


def test_an_empty_fleet_says_how_to_start_an_agent(reader):
    html = page(signed_in(reader), "state=lost")
    assert "No node has registered yet" in html and "node-counts" not in html


def test_a_filter_reads_back_as_the_same_query_string():
    node_filter = NodeFilter.from_query("q=%20gpu1%20&state=lost&pool=a&fabric=ib-0&page=3&x=1")
    assert node_filter == NodeFilter(state="lost", pool="a", fabric="ib-0", search="gpu1", page=3)
    assert node_filter.query() == "state=lost&pool=a&fabric=ib-0&q=gpu1&page=3"
    assert NodeFilter.from_query(node_filter.query()) == node_filter
    assert node_filter.query(page=1) == "state=lost&pool=a&fabric=ib-0&q=gpu1"
    assert NodeFilter().query() == "" and not NodeFilter(page=4).narrowed


def test_the_counts_are_one_query_whatever_the_filter(operator):
    many_nodes(30, unreachable_every=3)
    Node.objects.filter(id="gpu00000").update(state="lost")
    with CaptureQueriesContext(connection) as queries:
        counts = node_counts(NodeFilter.from_query("pool=a&q=gpu").where())
    assert len(queries.captured_queries) == 1
    assert counts == {
        "total": 30,
        "connected": 19,
        "unreachable": 10,
        "lost": 1,
        "draining": 0,
        "matched": 15,
    }


def test_the_filter_form_lands_on_the_short_url_to_share(operator):
    client = signed_in(operator)
    response = client.get("/?state=unreachable&pool=&fabric=&q=+gpu1+&x=1")
    assert response.status_code == 302 and response["Location"] == "/?state=unreachable&q=gpu1"
    response = client.get("/?state=&pool=&fabric=&q=")
    assert response.status_code == 302 and response["Location"] == "/"
    # A query with a mistake stays as it was sent, so the page can say what was wrong.
    assert client.get("/?state=bogus&pool=").status_code == 200


MODEL_ROW = re.compile(r'<tr class="model" data-model="([^"]+)"')


def test_a_large_catalog_shows_its_models_a_page_at_a_time(operator):
    from fleet.models import ReplicaState
    from fleet.pages.fragments import MODELS_PER_PAGE
    from tests.factories import make_model, make_profile, make_replica

    names = [f"model-{i:03d}" for i in range(MODELS_PER_PAGE + 5)]
    profiles = [make_profile(make_model(name, source=f"/models/{name}.gguf")) for name in names]
    make_replica(profiles[0], state=ReplicaState.READY)
    gone = make_replica(profiles[-1], state=ReplicaState.READY)
    gone_model = profiles[-1].model
    gone_model.delete()  # its replica still shows, on the last page, until it is stopped
    client = signed_in(operator)
    first = page(client)
    assert MODEL_ROW.findall(first) == names[:MODELS_PER_PAGE]
    assert "models page 1 of 2" in first and 'href="/?models=2"' in first
    last = page(client, "models=2&state=connected")
    assert MODEL_ROW.findall(last) == names[MODELS_PER_PAGE:-1] + [gone.model_name]
    assert f'id="replica-{gone.id}"' in last
    assert 'href="/?state=connected"' in last  # the nodes' filter is kept
    assert MODEL_ROW.findall(page(client, "models=bogus")) == names[:MODELS_PER_PAGE]
