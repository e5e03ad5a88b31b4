"""The playground: a member of the playground's group picks a ready model and chats with it
through the routers.

The page's script (``static/llmgw/playground.js``) asks the routers at ``LLMGW_ROUTER_URL``
directly, with the user's own short-lived key (``catalog.playground``), so every request is
routed, limited and counted like any client's; the control plane never relays an answer.
The key is the script's, in memory: the session keeps only which key it was.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, HttpResponseForbidden, JsonResponse
from django.shortcuts import render
from django.views.decorators.http import require_POST

from catalog.playground import (
    PlaygroundRefused,
    PlaygroundRules,
    issue_playground_key,
    may_use_playground,
    playground_models,
)
from fleet.models import Replica, ReplicaState

SESSION_KEY = "llmgw_playground_key"


def chat_models_ready() -> list[str]:
    """Models with a ready replica that serves chat, by name."""
    ready = Replica.objects.filter(state=ReplicaState.READY).select_related("profile")
    return sorted(
        {r.model_name for r in ready if r.profile is not None and "chat" in r.profile.served_kinds}
    )


def playground_page(view: Callable) -> Callable:
    """Signed in (else the login page) and in the playground's group (else 403, naming it)."""

    @login_required
    @wraps(view)
    def wrapper(request: HttpRequest, *args, **kwargs) -> HttpResponse:
        rules = PlaygroundRules.from_settings()
        if not may_use_playground(request.user, rules):
            return HttpResponseForbidden(rules.refusal(), content_type="text/plain")
        return view(request, rules, *args, **kwargs)

    return wrapper


@playground_page
def playground(request: HttpRequest, rules: PlaygroundRules) -> HttpResponse:
    covered = set(playground_models(rules))
    context = {
        "models": [name for name in chat_models_ready() if name in covered],
        "router_url": settings.ROUTER_URL.rstrip("/"),
    }
    return render(request, "fleet/playground.html", context)


@playground_page
@require_POST
def key(request: HttpRequest, rules: PlaygroundRules) -> HttpResponse:
    """A new playground key for the page's script (the user's previous one is revoked)."""
    try:
        issued = issue_playground_key(request.user, rules)
    except PlaygroundRefused as exc:
        return JsonResponse({"error": str(exc)}, status=exc.status)
    request.session[SESSION_KEY] = issued.reference()
    return JsonResponse(
        {"key": issued.key, "prefix": issued.prefix, "expires_at": issued.expires_at.isoformat()}
    )
