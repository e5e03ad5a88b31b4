"""The control plane's wiring: settings, urls, asgi and the Celery app; nothing else.

The Celery app is loaded with Django, as Celery's Django guide does, so that
``celery.current_app`` (what fleet sends node commands with) is this app in every process.
"""

from llmgw_site.celery import app as celery_app

__all__ = ["celery_app"]
