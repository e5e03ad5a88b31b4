"""Who may do what: every signed-in user reads; operators change things; engine admins
also choose what code nodes run (see ``catalog.engine_admin``)."""

from __future__ import annotations

from django.contrib.auth.base_user import AbstractBaseUser
from rest_framework.permissions import SAFE_METHODS, BasePermission

from audit.actors import ShellUser, SystemActor

OPERATORS_GROUP = "operators"
ENGINE_ADMINS_GROUP = "engine-admin"


def is_operator(user) -> bool:
    """An operator may change the catalog, drain nodes and restart replicas."""
    if not user or not user.is_authenticated:
        return False
    return user.is_superuser or user.groups.filter(name=OPERATORS_GROUP).exists()


def is_engine_admin(actor) -> bool:
    """An engine admin may also make nodes run code of their choosing: engine builds, apt
    packages, loader variables, remote code.

    llmgw's own parts may, and so may ``llmgw_ctl`` at the control plane's shell: whoever
    runs it holds the database and ``SECRET_KEY``, so is root on the control plane (and
    through it on every node) already; a group check there would stop no one.
    """
    if isinstance(actor, SystemActor | ShellUser):
        return True
    if not isinstance(actor, AbstractBaseUser) or not actor.is_authenticated:
        return False
    return bool(
        getattr(actor, "is_superuser", False)
        or actor.groups.filter(name=ENGINE_ADMINS_GROUP).exists()  # type: ignore[attr-defined]
    )


class IsOperatorOrReadOnly(BasePermission):
    message = "Changing this needs the operator role; ask an admin to add you to 'operators'."

    def has_permission(self, request, view) -> bool:
        if not request.user or not request.user.is_authenticated:
            return False
        return request.method in SAFE_METHODS or is_operator(request.user)
