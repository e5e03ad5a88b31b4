"""Sizes and durations as people write them in a catalog: ``1GiB``, ``300MiB``, ``10m``."""

from __future__ import annotations

import re

_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "ki": 1024,
    "kib": 1024,
    "mi": 1024**2,
    "mib": 1024**2,
    "gi": 1024**3,
    "gib": 1024**3,
    "ti": 1024**4,
    "tib": 1024**4,
}
_DURATION_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
_NUMBER_UNIT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(value: str | int) -> int:
    """Return a size in bytes; ``1GiB`` is 1024**3, ``1GB`` is 1000**3, a bare number is bytes."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a size; write it like 1GiB or 300MiB")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"{value} is negative; a size must be 0 or more")
        return value
    match = _NUMBER_UNIT.match(str(value))
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _SIZE_UNITS:
        raise ValueError(f"{value!r} is not a size; write it like 1GiB, 300MiB or 2GB")
    return int(float(match.group(1)) * _SIZE_UNITS[unit])


def parse_duration(value: str | int) -> int:
    """Return a duration in whole seconds; ``600s``, ``10m``, ``1h`` or a bare number of seconds."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a duration; write it like 600s or 10m")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"{value} is negative; a duration must be 0 or more")
        return value
    match = _NUMBER_UNIT.match(str(value))
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _DURATION_UNITS:
        raise ValueError(f"{value!r} is not a duration; write it like 600s, 10m or 1h")
    return int(float(match.group(1)) * _DURATION_UNITS[unit])


def format_size(size: int) -> str:
    """Write bytes the way ``parse_size`` reads them back exactly where it can (``1GiB``)."""
    for unit, factor in (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if size >= factor and size % factor == 0:
            return f"{size // factor}{unit}"
    return str(size)


def format_duration(seconds: int) -> str:
    """Write seconds as ``10m`` or ``90s``, readable and parseable."""
    if seconds and seconds % 3600 == 0:
        return f"{seconds // 3600}h"
    if seconds and seconds % 60 == 0:
        return f"{seconds // 60}m"
    return f"{seconds}s"
