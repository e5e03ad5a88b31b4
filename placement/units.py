"""Sizes and counts in the words an operator reads in a refusal."""

from __future__ import annotations

_UNITS = (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10))


def format_bytes(size: int, digits: int = 1) -> str:
    """Write a byte count in binary units: 42949672960 -> "40 GiB", 1610612736 -> "1.5 GiB"."""
    for name, unit in _UNITS:
        if abs(size) >= unit:
            text = f"{size / unit:.{digits}f}".rstrip("0").rstrip(".")
            return f"{text} {name}"
    return f"{size} B"


def format_need_and_have(need: int, have: int) -> tuple[str, str]:
    """Write two sizes so that they read as different whenever they are.

    "needs 40 GiB, has 40 GiB" is a refusal nobody can act on; one byte short
    must still show, so precision grows until the two differ.
    """
    for digits in (1, 2, 3):
        need_text, have_text = format_bytes(need, digits), format_bytes(have, digits)
        if need_text != have_text or need == have:
            return need_text, have_text
    return f"{need:,} bytes", f"{have:,} bytes"


def plural(count: int, noun: str) -> str:
    """Write the noun as the count needs it: "GPU" for 1, "GPUs" otherwise."""
    return noun if count == 1 else f"{noun}s"


def count_of(count: int, noun: str) -> str:
    """Write "1 GPU" or "2 GPUs"."""
    return f"{count} {plural(count, noun)}"
