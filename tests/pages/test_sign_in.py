"""Sign-in that cannot be guessed at (fleet.pages.sign_in), and the cookies it leaves behind."""

from __future__ import annotations

import datetime as dt
import logging
import runpy

import pytest
from django.contrib.auth.backends import ModelBackend
from django.test import Client, override_settings
from django.utils import timezone

from audit.models import Event, EventKind
from audit.redis import redis_client
from core.addresses import trusted_networks
from fleet.pages.sign_in import KEY_PREFIX
from llmgw_site import settings as site_settings

pytestmark = pytest.mark.django_db

LOGIN = "/accounts/login/"
ADMIN_LOGIN = "/admin/login/"
GUESSER = "10.0.0.5"


@pytest.fixture(autouse=True)
def fresh_counters():
    """Each test starts with no failures counted, whatever an earlier run left in Redis."""

    def forget() -> None:
        client = redis_client()
        for key in client.scan_iter(f"{KEY_PREFIX}:*"):
            client.delete(key)

    forget()
    yield
    forget()


@pytest.fixture
def password_checks(monkeypatch):
    """Every username whose password was checked against the database."""
    checked = []
    authenticate = ModelBackend.authenticate

    def spy(self, request, username=None, password=None, **kwargs):
        checked.append(username)
        return authenticate(self, request, username=username, password=password, **kwargs)

    monkeypatch.setattr(ModelBackend, "authenticate", spy)
    return checked


def sign_in(client, username, password, address=GUESSER, url=LOGIN):
    return client.post(url, {"username": username, "password": password}, REMOTE_ADDR=address)


def signed_in(client) -> bool:
    return "_auth_user_id" in client.session


def fail(client, times, username="olga", address=GUESSER, url=LOGIN):
    for _ in range(times):
        response = sign_in(client, username, "not-it", address, url)
        assert response.status_code == 200
    return response


def test_five_wrong_passwords_lock_the_pair_even_against_the_right_one(
    operator, password_checks, time_machine
):
    start = timezone.now()
    time_machine.move_to(start, tick=False)
    client = Client()
    for _ in range(4):
        assert "do not match" in sign_in(client, "olga", "not-it").content.decode()
    fifth = sign_in(client, "olga", "not-it").content.decode()
    assert "Too many failed sign-ins for olga from 10.0.0.5: try again in 15 minutes." in fifth

    checked = len(password_checks)
    time_machine.move_to(start + dt.timedelta(seconds=61), tick=False)
    response = sign_in(client, "olga", "pw-olga")
    assert response.status_code == 200 and not signed_in(client)
    assert (
        "Too many failed sign-ins for olga from 10.0.0.5: try again in 14 minutes."
        in response.content.decode()
    )
    assert len(password_checks) == checked, "a locked pair's password was checked"

    (event,) = Event.objects.filter(kind=EventKind.SIGN_IN, to_state="locked")
    assert event.subject == "olga"
    assert event.reason == "locked out from 10.0.0.5 for 15 minutes after 5 failed sign-ins"
    assert event.actor is None
    # Each wrong password is an Event of its own; the locked pair's try never reached one.
    refused = Event.objects.filter(kind=EventKind.SIGN_IN, to_state="refused")
    assert [e.reason for e in refused] == ["sign-in refused from 10.0.0.5"] * 5


def test_another_address_still_signs_in(operator):
    client = Client()
    fail(client, 5)
    response = sign_in(client, "olga", "pw-olga", address="10.0.0.9")
    assert response.status_code == 302 and signed_in(client)


PROXY = "192.0.2.10"  # the TLS-terminating proxy in front of the control plane


def via_proxy(client, username, password, forwarded_for):
    return client.post(LOGIN, {"username": username, "password": password}, REMOTE_ADDR=PROXY,
                       HTTP_X_FORWARDED_FOR=forwarded_for)  # fmt: skip


@override_settings(TRUSTED_PROXIES=trusted_networks(["192.0.2.0/28"]))
def test_behind_a_trusted_proxy_lockouts_apply_per_forwarded_address(operator):
    client = Client()
    for _ in range(5):
        via_proxy(client, "olga", "not-it", "10.0.0.5")
    # The real operator, through the same proxy from another address, is not locked out.
    assert via_proxy(client, "olga", "pw-olga", "10.0.0.9").status_code == 302
    assert signed_in(client)
    locked = via_proxy(Client(), "olga", "pw-olga", "10.0.0.5").content.decode()
    assert "Too many failed sign-ins for olga from 10.0.0.5" in locked
    # What the guesser writes into the header ahead of the proxy's own entry is not believed.
    spoofed = via_proxy(Client(), "olga", "pw-olga", "10.0.0.77, 10.0.0.5").content.decode()
    assert "Too many failed sign-ins for olga from 10.0.0.5" in spoofed
    (event,) = Event.objects.filter(kind=EventKind.SIGN_IN, to_state="locked")
    assert event.reason.startswith("locked out from 10.0.0.5 ")


def test_a_forwarded_address_from_an_untrusted_peer_is_not_believed(operator):
    client = Client()
    for number in range(5):  # a fresh "address" each time: still one pair, locked
        via_proxy(client, "olga", "not-it", f"10.0.1.{number}")
    locked = via_proxy(client, "olga", "pw-olga", "10.0.1.99").content.decode()
    assert f"Too many failed sign-ins for olga from {PROXY}" in locked


def test_the_pair_signs_in_once_the_window_has_passed(operator, time_machine):
    start = timezone.now()
    time_machine.move_to(start, tick=False)
    client = Client()
    fail(client, 5)
    time_machine.move_to(start + dt.timedelta(minutes=14, seconds=59), tick=False)
    assert "try again in 1 minute." in sign_in(client, "olga", "pw-olga").content.decode()
    time_machine.move_to(start + dt.timedelta(minutes=15, seconds=1), tick=False)
    response = sign_in(client, "olga", "pw-olga")
    assert response.status_code == 302 and signed_in(client)


def test_a_success_resets_the_count(operator):
    client = Client()
    fail(client, 4)
    assert sign_in(client, "olga", "pw-olga").status_code == 302
    client.logout()
    assert "do not match" in fail(client, 4).content.decode()
    assert sign_in(client, "olga", "pw-olga").status_code == 302


def test_the_username_is_counted_whatever_its_case(operator):
    client = Client()
    fail(client, 3, username="OLGA")
    fail(client, 2, username="Olga")
    response = sign_in(client, "olga", "pw-olga")
    assert "Too many failed sign-ins for olga from 10.0.0.5" in response.content.decode()
    assert not signed_in(client)


def test_the_admin_sign_in_is_throttled_with_the_same_counters(admin_user, password_checks):
    admin_user.is_staff = True
    admin_user.save()
    client = Client()
    fail(client, 3, username="admin", url=ADMIN_LOGIN)
    fail(client, 2, username="admin", url=LOGIN)
    checked = len(password_checks)
    response = sign_in(client, "admin", "pw-admin", url=ADMIN_LOGIN)
    assert response.status_code == 200 and not signed_in(client)
    assert (
        "Too many failed sign-ins for admin from 10.0.0.5: try again in 15 minutes."
        in response.content.decode()
    )
    assert len(password_checks) == checked
    other = Client()
    response = sign_in(other, "admin", "pw-admin", address="10.0.0.9", url=ADMIN_LOGIN)
    assert response.status_code == 302 and signed_in(other)


def test_a_right_password_without_staff_is_not_counted_as_a_guess(operator):
    client = Client()
    for _ in range(6):
        response = sign_in(client, "olga", "pw-olga", url=ADMIN_LOGIN)
        assert "staff account" in response.content.decode()
    assert sign_in(client, "olga", "pw-olga").status_code == 302


def test_with_redis_away_sign_in_still_works(operator, caplog):
    client = Client()
    with override_settings(REDIS_URL="redis://127.0.0.1:1/0"), caplog.at_level(logging.WARNING):
        fail(client, 6)
        response = sign_in(client, "olga", "pw-olga")
    assert response.status_code == 302 and signed_in(client)
    assert "sign-in throttling is off" in caplog.text


def test_cookies_are_http_only_and_lax(operator):
    client = Client()
    client.get(LOGIN)
    response = sign_in(client, "olga", "pw-olga")
    assert response.status_code == 302
    session = response.cookies["sessionid"]
    assert session["httponly"] is True
    assert session["samesite"] == "Lax"
    assert client.cookies["csrftoken"]["samesite"] == "Lax"


@pytest.mark.parametrize(
    ("environment", "secure"),
    [
        ({}, False),
        ({"LLMGW_CONTROL_PLANE_ID": "wss://cp1.example:8443"}, True),
        ({"LLMGW_SECURE_COOKIES": "true"}, True),
        ({"LLMGW_CONTROL_PLANE_ID": "wss://cp1.example:8443", "LLMGW_SECURE_COOKIES": "0"}, False),
    ],
    ids=["plain-http", "served-over-tls", "knob-on", "knob-off-over-tls"],
)
def test_cookies_are_secure_when_served_over_tls(monkeypatch, environment, secure):
    monkeypatch.delenv("LLMGW_SECURE_COOKIES", raising=False)
    monkeypatch.delenv("LLMGW_CONTROL_PLANE_ID", raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    # Read afresh, as a process started with this environment would: not the module in use.
    fresh = runpy.run_path(site_settings.__file__)
    assert fresh["SESSION_COOKIE_SECURE"] is secure
    assert fresh["CSRF_COOKIE_SECURE"] is secure
    assert fresh["SESSION_COOKIE_HTTPONLY"] is True


def test_a_secure_sign_in_sets_secure_cookies(operator):
    with override_settings(SESSION_COOKIE_SECURE=True, CSRF_COOKIE_SECURE=True):
        client = Client()
        client.get(LOGIN, secure=True)
        response = client.post(
            LOGIN, {"username": "olga", "password": "pw-olga"}, secure=True, REMOTE_ADDR=GUESSER
        )
    assert response.status_code == 302
    assert response.cookies["sessionid"]["secure"] is True
    assert response.cookies["sessionid"]["httponly"] is True
    assert client.cookies["csrftoken"]["secure"] is True
