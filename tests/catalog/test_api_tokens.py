"""REST API tokens: stored hashed with an expiry, issued and revoked by `llmgw_ctl`, and
DRF's plaintext tokens moved into them by the migration."""

from __future__ import annotations

import importlib
from datetime import timedelta

import pytest
import time_machine
from django.apps import apps
from django.core.management import CommandError
from django.db import connection

from catalog.models import ApiToken
from catalog.tokens.stored import hash_token
from tests.ctl import ctl
from tests.factories import api_token_of

pytestmark = pytest.mark.django_db

MODELS = "/api/v1/models/"


def every_text_value() -> list[str]:
    """Every text value of every row of every table llmgw keeps."""
    values: list[str] = []
    with connection.cursor() as cursor:
        for table in connection.introspection.table_names():
            cursor.execute(f'SELECT * FROM "{table}"')  # noqa: S608 (names from the catalog)
            values += [v for row in cursor.fetchall() for v in row if isinstance(v, str)]
    return values


def test_an_issued_token_reads_the_api_and_no_column_holds_it(api_client, reader):
    token = ctl("api-tokens", "create", reader.username).splitlines()[0]
    assert token.startswith("llmgwt-")
    api_client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    assert api_client.get(MODELS).status_code == 200
    assert not any(token in value for value in every_text_value())
    row = ApiToken.objects.get()
    assert row.hashed_token == hash_token(token) and row.user == reader
    assert timedelta(days=89) < row.expires_at - row.created_at <= timedelta(days=90)


def test_an_expired_token_is_refused_saying_how_to_get_another(api_client, reader):
    token = api_token_of(reader, lifetime=timedelta(hours=1))
    api_client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    with time_machine.travel(timedelta(hours=2)):
        response = api_client.get(MODELS)
    assert response.status_code == 401
    assert "expired" in response.json()["detail"]
    assert "api-tokens create" in response.json()["detail"]


def test_a_revoked_token_is_refused(api_client, reader):
    token = api_token_of(reader)
    api_client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    assert api_client.get(MODELS).status_code == 200
    assert "revoked API token" in ctl("api-tokens", "revoke", token[:15])
    assert api_client.get(MODELS).status_code == 401
    assert reader.username in ctl("api-tokens", "list")


def test_a_token_for_an_unknown_account_is_refused_naming_it():
    with pytest.raises(CommandError, match="no account named 'nobody'"):
        ctl("api-tokens", "create", "nobody")


def test_drf_plaintext_tokens_are_moved_hashed_and_keep_working(api_client, reader):
    """What the migration does to a database DRF's token app wrote to."""
    old = "0123456789abcdef0123456789abcdef01234567"
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE TABLE authtoken_token (key varchar(40) PRIMARY KEY, "
            "created timestamptz NOT NULL DEFAULT now(), user_id integer NOT NULL)"
        )
        cursor.execute("INSERT INTO authtoken_token (key, user_id) VALUES (%s, %s)",
                       [old, reader.id])  # fmt: skip
    migration = importlib.import_module("catalog.migrations.0008_hashed_api_tokens")
    with connection.schema_editor() as editor:
        migration.hash_drf_tokens(apps, editor)
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM authtoken_token")
        assert cursor.fetchone() == (0,)  # no plaintext left
    api_client.credentials(HTTP_AUTHORIZATION=f"Token {old}")
    assert api_client.get(MODELS).status_code == 200
    assert ApiToken.objects.get().prefix == old[:15]
