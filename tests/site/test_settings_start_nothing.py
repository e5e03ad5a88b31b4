"""Importing the settings reads configuration and starts nothing: the entry points start
the embedded servers before settings are read."""

from __future__ import annotations

import os
import subprocess
import sys

IMPORT_AND_COUNT = """
import os, psutil
os.environ["DJANGO_SETTINGS_MODULE"] = "llmgw_site.settings"
from django.conf import settings
try:
    print("database", settings.DATABASES["default"]["NAME"])
except Exception as exc:
    print(type(exc).__name__, exc)
print("children", len(psutil.Process().children(recursive=True)))
"""


def _import_settings(home, **env: str) -> str:
    base = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    result = subprocess.run(
        [sys.executable, "-c", IMPORT_AND_COUNT],
        env={**base, "LLMGW_HOME": str(home), **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return result.stdout


def test_settings_with_urls_configured_start_no_process(tmp_path):
    out = _import_settings(
        tmp_path / "home",
        DATABASE_URL="postgresql://nobody@127.0.0.1:1/elsewhere",
        REDIS_URL="redis://127.0.0.1:1/0",
    )
    assert "database elsewhere" in out
    assert "children 0" in out
    assert not (tmp_path / "home" / "postgres").exists()
    assert not (tmp_path / "home" / "redis").exists()


def test_settings_without_a_database_url_say_how_to_start_and_start_nothing(tmp_path):
    out = _import_settings(tmp_path / "home")
    assert "ImproperlyConfigured DATABASE_URL is not set" in out
    assert "manage.py" in out and "set DATABASE_URL" in out
    assert "children 0" in out
    assert not (tmp_path / "home" / "postgres").exists()
