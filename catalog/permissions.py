"""Who may do what: every signed-in user reads; operators change things."""

from __future__ import annotations

from rest_framework.permissions import SAFE_METHODS, BasePermission

OPERATORS_GROUP = "operators"


def is_operator(user) -> bool:
    """An operator may change the catalog, drain nodes and restart replicas."""
    if not user or not user.is_authenticated:
        return False
    return user.is_superuser or user.groups.filter(name=OPERATORS_GROUP).exists()


class IsOperatorOrReadOnly(BasePermission):
    message = "Changing this needs the operator role; ask an admin to add you to 'operators'."

    def has_permission(self, request, view) -> bool:
        if not request.user or not request.user.is_authenticated:
            return False
        return request.method in SAFE_METHODS or is_operator(request.user)
