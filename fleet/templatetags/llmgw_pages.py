"""Filters the fleet pages use to write sizes, durations and shares for people."""

from __future__ import annotations

from datetime import datetime, timedelta

from django import template
from django.utils import timezone

from core.humanize import format_bytes, format_seconds

register = template.Library()


@register.filter
def size(value: float | None) -> str:
    """Bytes as '15.2 GiB'; an unknown size as '?'."""
    return "?" if value is None else format_bytes(value)


@register.filter
def duration(value: timedelta | None) -> str:
    """A duration as '12 s', '5 min', '3 h' or '2 d'."""
    return "never" if value is None else format_seconds(value.total_seconds())


@register.filter
def age(moment: datetime | None) -> str:
    """How long ago ``moment`` was, as ``duration`` writes it."""
    return "never" if moment is None else duration(timezone.now() - moment)


@register.filter
def width(percent: float | None) -> str:
    """A share as a CSS width ('41.0%'), for bars; an unknown one as 0."""
    return f"{max(0.0, min(100.0, percent or 0.0)):.1f}%"


@register.filter
def count(value: int | None) -> str:
    """A whole number with thousands apart, as '2,000'."""
    return "0" if value is None else f"{value:,}"
