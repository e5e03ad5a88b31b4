"""``celery -A llmgw_cli``: the control plane's Celery app, with the embedded services
started first when DATABASE_URL / REDIS_URL are unset, as every entry point does."""

import os

from llmgw_cli.embedded import configure_services

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llmgw_site.settings")
configure_services()

from llmgw_site.celery import app  # noqa: E402

__all__ = ["app"]
