"""The audit page over HTTP and its socket: who reads what, the filters, the pages of the
log, the exports, and new Events arriving on the newest page."""

from __future__ import annotations

import csv
import io
import json
import re
from datetime import timedelta

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import Client
from django.utils import timezone

from audit.actors import SystemActor
from audit.events import record_event
from audit.models import Event, EventKind
from tests.audit.events_made import log_of
from tests.pages.asgi_client import application, session_cookie

pytestmark = pytest.mark.django_db

SETUP = SystemActor("test setup")


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def body(response) -> str:
    """A streamed export, read whole (iterating it reads the async stream, as daphne would)."""
    return b"".join(response).decode()


def shown(html: str) -> list[str]:
    """The objects of the event rows a page shows, in order."""
    return re.findall(r'<tr id="event-\d+" class="event" [^>]*data-object="([^"]*)"', html)


@pytest.fixture
def log(operator, reader):
    """Olga's node drains, a key the reader made, and what llmgw did; the accounts' own
    making (their groups) is not part of it."""
    Event.objects.all().delete()
    now = timezone.now()
    log_of(60, now - timedelta(hours=2), timedelta(minutes=1), kind="node", subject="node07",
           actor_name="olga")  # fmt: skip
    Event.objects.filter(actor_name="olga").update(actor=operator)
    (key,) = log_of(1, now - timedelta(minutes=5), kind="key", subject="sk-rita")
    Event.objects.filter(id=key.id).update(actor=reader, actor_name="rita")
    log_of(1, now - timedelta(minutes=4), kind="catalog", subject="model/gemma")


def test_a_page_needs_a_sign_in_and_so_does_an_export(client):
    for path in ("/audit/", "/audit/events.csv", "/audit/events.json"):
        response = client.get(path)
        assert response.status_code == 302 and "/accounts/login/" in response["Location"]


def test_an_operator_reads_every_event_newest_first_a_page_at_a_time(operator, log):
    html = signed_in(operator).get("/audit/").content.decode()
    rows = shown(html)
    # Her own sign-in (the test client's) first, then the log.
    assert rows[:4] == ["olga", "model/gemma", "sk-rita", "node07"] and len(rows) == 50
    assert "Every event" in html
    older = re.search(r'href="(/audit/\?before=\d+)" rel="next"', html).group(1)
    second = signed_in(operator).get(older).content.decode()
    assert shown(second) == ["node07"] * 13 and 'rel="next"' not in second
    assert 'rel="prev"' in second and 'rel="first"' in second


def test_a_reader_reads_only_what_they_did_and_what_was_done_to_them(reader, log):
    html = signed_in(reader).get("/audit/").content.decode()
    # Their key, and their own sign-in just now (the test client's).
    assert shown(html) == ["rita", "sk-rita"]
    assert "What you did, and what was done to your account" in html
    records = json.loads(body(signed_in(reader).get("/audit/events.json")))
    assert {r["object"] for r in records} == {"rita", "sk-rita"}


def test_filters_narrow_the_page_and_what_is_wrong_is_said(operator, log):
    client = signed_in(operator)
    assert shown(client.get("/audit/?kind=key").content.decode()) == ["sk-rita"]
    assert shown(client.get("/audit/?actor=llmgw&kind=catalog").content.decode()) == ["model/gemma"]
    page = client.get("/audit/?object=model/", follow=True)
    assert shown(page.content.decode()) == ["model/gemma"]
    # The form sends its empty fields too: the URL to share is the short one.
    form_sent = client.get("/audit/?actor=&kind=key&object=&since=&until=")
    assert (form_sent.status_code, form_sent["Location"]) == (302, "/audit/?kind=key")
    assert len(shown(client.get("/audit/?actor=olga&kind=node&since=30m").content.decode())) == 0
    assert len(shown(client.get("/audit/?actor=olga&kind=node&since=90.5m").content.decode())) == 30
    html = client.get("/audit/?kind=nodes&team=search").content.decode()
    assert "&#x27;nodes&#x27; is not a kind of event" in html
    assert "team &#x27;search&#x27;: there is no such team" in html
    assert len(shown(html)) == 50  # shown as if not asked


def test_exports_hold_every_event_the_filter_picks(operator, log):
    client = signed_in(operator)
    response = client.get("/audit/events.csv?actor=olga&kind=node&since=90.5m")
    assert response["Content-Type"].startswith("text/csv")
    assert response["Content-Disposition"].startswith('attachment; filename="llmgw-events-')
    rows = list(csv.DictReader(io.StringIO(body(response))))
    assert len(rows) == 30 and {r["actor"] for r in rows} == {"olga"}
    records = json.loads(body(client.get("/audit/events.json?kind=node")))
    assert len(records) == 60  # not a page: every one
    refused = client.get("/audit/events.csv?since=soon")
    assert refused.status_code == 400 and b"since: 'soon' is not a time" in refused.content


def test_the_api_reads_as_the_page_does(operator, reader, log):
    rows = signed_in(reader).get("/api/v1/events/?limit=100").json()["results"]
    assert {r["subject"] for r in rows} == {"rita", "sk-rita"}
    keys = signed_in(operator).get("/api/v1/events/?kind=key").json()["results"]
    assert [r["subject"] for r in keys] == ["sk-rita"]
    assert signed_in(operator).get("/api/v1/events/?since=soon").status_code == 400


async def socket(user, query: str = "") -> tuple[WebsocketCommunicator, str]:
    session = await session_cookie(user)
    headers = [(b"host", b"testserver"), (b"origin", b"http://testserver"),
               (b"cookie", f"sessionid={session}".encode())]  # fmt: skip
    communicator = WebsocketCommunicator(
        application(), f"/ws/pages/audit/{'?' + query if query else ''}", headers=headers
    )
    accepted, _ = await communicator.connect(timeout=10)
    assert accepted
    return communicator, await communicator.receive_from(timeout=10)


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_a_new_event_arrives_on_the_newest_page_as_its_reader_may_read_it(operator, reader):
    olgas, first = await socket(operator, "kind=node")
    ritas, _ = await socket(reader)
    assert first.lstrip().startswith('<section id="audit-events">')

    await database_sync_to_async(record_event)(EventKind.NODE, "node09", "drained", actor=operator)

    pushed = await olgas.receive_from(timeout=10)
    assert shown(pushed)[0] == "node09"
    assert await ritas.receive_nothing(timeout=1.5)  # not hers to read
    await database_sync_to_async(record_event)(EventKind.KEY, "sk-x", "created", actor=SETUP)
    assert await olgas.receive_nothing(timeout=1.5)  # her page asks for nodes only
    await olgas.disconnect()
    await ritas.disconnect()
