"""API errors that name the thing and the fix, in the same words as ``apply``."""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from rest_framework import status
from rest_framework.exceptions import ParseError, ValidationError
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from catalog.schema import CatalogError


def exception_handler(exc, context):
    if isinstance(exc, CatalogError):
        exc = ValidationError({"errors": exc.problems})
    elif isinstance(exc, RequestDataTooBig):
        # Refused by its declared size, before a byte of it is parsed.
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        return Response(
            {"detail": f"The request body is over {limit} bytes (LLMGW_API_MAX_BODY)."},
            status=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE,
        )
    elif isinstance(exc, RecursionError):  # the JSON parser's own limit, reached by nesting
        exc = ParseError("JSON parse error - the body is nested too deeply to be read.")
    return drf_exception_handler(exc, context)
