"""Reaching the real ASGI application in-process, signed in."""

from __future__ import annotations

from channels.db import database_sync_to_async
from django.test import Client


def application():
    from llmgw_site.asgi import application

    return application


@database_sync_to_async
def session_cookie(user) -> str:
    client = Client()
    client.force_login(user)
    return client.cookies["sessionid"].value
