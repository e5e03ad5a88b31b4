"""API errors that name the thing and the fix, in the same words as ``apply``."""

from __future__ import annotations

from rest_framework.views import exception_handler as drf_exception_handler

from catalog.schema import CatalogError


def exception_handler(exc, context):
    if isinstance(exc, CatalogError):
        from rest_framework.exceptions import ValidationError

        exc = ValidationError({"errors": exc.problems})
    return drf_exception_handler(exc, context)
