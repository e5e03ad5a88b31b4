"""Every request names its user as who acts (``audit.actors.acting_as``), so a change
Django reports by signal, without the request (a group changed in the admin), still
records who made it."""

from __future__ import annotations

from asgiref.sync import iscoroutinefunction
from django.utils.decorators import sync_and_async_middleware

from audit.actors import acting_as


@sync_and_async_middleware
def acting_user_middleware(get_response):
    # Both kinds: a sync-only middleware would push every async view onto a thread.
    if iscoroutinefunction(get_response):

        async def middleware_async(request):
            with acting_as(request.user):
                return await get_response(request)

        return middleware_async

    def middleware(request):
        with acting_as(request.user):
            return get_response(request)

    return middleware
