"""The playground: a signed-in user picks a ready model and chats with it through the routers.

The page's script (``static/llmgw/playground.js``) asks the routers at ``LLMGW_ROUTER_URL``
directly, with the user's own short-lived key (``catalog.playground``), so every request is
routed, limited and counted like any client's; the control plane never relays an answer.
"""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.views.decorators.http import require_POST

from catalog.playground import playground_key
from fleet.models import Replica, ReplicaState

SESSION_KEY = "llmgw_playground_key"


def chat_models_ready() -> list[str]:
    """Models with a ready replica that serves chat, by name."""
    ready = Replica.objects.filter(state=ReplicaState.READY).select_related("profile")
    return sorted(
        {r.model_name for r in ready if r.profile is not None and "chat" in r.profile.served_kinds}
    )


@login_required
def playground(request: HttpRequest) -> HttpResponse:
    context = {"models": chat_models_ready(), "router_url": settings.ROUTER_URL.rstrip("/")}
    return render(request, "fleet/playground.html", context)


@login_required
@require_POST
def key(request: HttpRequest) -> HttpResponse:
    """The user's playground key (the session's while it stays good), for the page's script."""
    issued = playground_key(
        request.user, request.session.get(SESSION_KEY), lifetime=settings.PLAYGROUND_KEY_LIFETIME
    )
    request.session[SESSION_KEY] = issued.as_session()
    return JsonResponse(
        {"key": issued.key, "prefix": issued.prefix, "expires_at": issued.expires_at.isoformat()}
    )
