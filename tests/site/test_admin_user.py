"""`manage.py llmgw_admin`, as `llmgw up` runs it: the first admin, from the environment."""

from __future__ import annotations

import pytest
from django.contrib.auth import authenticate
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command

pytestmark = pytest.mark.django_db


def test_it_creates_the_admin_and_sets_a_new_password_when_run_again(monkeypatch):
    monkeypatch.setenv("LLMGW_ADMIN_PASSWORD", "first-secret")
    call_command("llmgw_admin")
    admin = User.objects.get(username="admin")
    assert admin.is_staff and admin.is_superuser
    assert authenticate(username="admin", password="first-secret") == admin

    monkeypatch.setenv("LLMGW_ADMIN_PASSWORD", "second-secret")
    call_command("llmgw_admin")
    assert User.objects.count() == 1
    assert authenticate(username="admin", password="second-secret") == admin


def test_without_a_password_in_the_environment_it_changes_nothing(monkeypatch):
    monkeypatch.delenv("LLMGW_ADMIN_PASSWORD", raising=False)
    with pytest.raises(CommandError, match="set LLMGW_ADMIN_PASSWORD"):
        call_command("llmgw_admin")
    assert not User.objects.exists()
