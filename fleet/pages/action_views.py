"""The buttons on the pages: operators drain nodes, restart replicas, scale profiles,
delete models and have placement's refusals worked out again.

Every action is a POST that calls a verb; read-only users get 403, whatever URL they
try. An htmx request gets 204 and a message to show: the change itself reaches the
page over its websocket, like any other change.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import wraps

from django.contrib.auth.decorators import login_required
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseBadRequest,
    HttpResponseForbidden,
)
from django.shortcuts import redirect
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST

from catalog.actions.entries import delete_entry
from catalog.actions.profiles import scale_profile
from catalog.models import Model, Profile
from catalog.permissions import is_operator
from fleet.actions.nodes import drain_node, undrain_node
from fleet.actions.replicas import ReplicaRefused, check_placement_again, restart_replica
from fleet.models import Node, Replica, ReplicaState
from fleet.pages.views import HtmxRequest

NOT_AN_OPERATOR = "Changing this needs the operator role; ask an admin to add you to 'operators'.\n"


def operator_page(view: Callable) -> Callable:
    """Signed in (else the login page) and the operator role (else 403), GET or POST."""

    @login_required
    @wraps(view)
    def wrapper(request: HttpRequest, *args, **kwargs) -> HttpResponse:
        if not is_operator(request.user):
            return HttpResponseForbidden(NOT_AN_OPERATOR, content_type="text/plain")
        return view(request, *args, **kwargs)

    return wrapper


def operator_action(view: Callable) -> Callable:
    """An operator's page that only changes things: POST only (else 405)."""
    return operator_page(require_POST(view))


def _done(request: HtmxRequest, message: str) -> HttpResponse:
    if request.htmx:
        response = HttpResponse(status=204)
        response["HX-Trigger"] = json.dumps({"llmgw-done": message})
        return response
    back = request.POST.get("next") or request.headers.get("Referer", "")
    if not url_has_allowed_host_and_scheme(back, {request.get_host()}, request.is_secure()):
        back = "/"
    return redirect(back)


@operator_action
def drain(request: HtmxRequest, node_id: str) -> HttpResponse:
    if not Node.objects.filter(id=node_id).exists():
        raise Http404(f"no node named {node_id!r}")
    changed = drain_node(node_id, actor=request.user)
    return _done(request, f"{node_id} is draining" if changed else f"{node_id} was draining")


@operator_action
def undrain(request: HtmxRequest, node_id: str) -> HttpResponse:
    if not Node.objects.filter(id=node_id).exists():
        raise Http404(f"no node named {node_id!r}")
    changed = undrain_node(node_id, actor=request.user)
    message = f"{node_id} is back in service" if changed else f"{node_id} was not draining"
    return _done(request, message)


@operator_action
def restart(request: HtmxRequest, replica_id) -> HttpResponse:
    replica = Replica.objects.filter(id=replica_id).first()
    if replica is None:
        raise Http404(f"no replica {replica_id}")
    changed = restart_replica(replica.id, actor=request.user)
    short = str(replica.id)[:8]
    message = (
        f"replica {short} of {replica.model_name} will be replaced"
        if changed
        else f"replica {short} is already {replica.state}; nothing to restart"
    )
    return _done(request, message)


@operator_action
def scale(request: HtmxRequest, profile_id: int) -> HttpResponse:
    profile = Profile.objects.select_related("model").filter(id=profile_id).first()
    if profile is None:
        raise Http404(f"no profile {profile_id}")
    try:
        replicas = int(request.POST.get("replicas", ""))
        if replicas < 0 or replicas > 1000:
            raise ValueError
    except ValueError:
        return HttpResponseBadRequest(
            "replicas must be a whole number from 0 to 1000\n", content_type="text/plain"
        )
    scale_profile(profile.id, replicas, actor=request.user)
    return _done(request, f"{profile.model.name}/{profile.name} wants {replicas} replica(s)")


@operator_action
def delete_model(request: HtmxRequest, model_id: int) -> HttpResponse:
    model = Model.objects.filter(id=model_id).first()
    if model is None:
        raise Http404(f"no model {model_id}")
    running = Replica.objects.filter(model_name=model.name, state__in=ReplicaState.COUNTED).count()
    delete_entry("model", model.name, actor=request.user)
    stopping = f"; its {running} replica(s) stop" if running else ""
    return _done(request, f"deleted {model.name}{stopping}")


@operator_action
def check_placement(request: HtmxRequest, name: str) -> HttpResponse:
    try:
        waiting = check_placement_again(name, actor=request.user)
    except ReplicaRefused as exc:
        return HttpResponseBadRequest(f"{exc}\n", content_type="text/plain")
    return _done(request, f"{name}: why {waiting} replica(s) wait is worked out again now")
