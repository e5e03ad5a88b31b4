"""Sizes, durations and counts in the words an operator reads: on pages, in `llmgw_ctl`'s
tables and in refusals. Binary units everywhere, so a page and a refusal that speak of
one GPU give it the same size. What config files read back lives in protocol.units."""

from __future__ import annotations

from collections.abc import Sequence

_UNITS = (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10))


def format_bytes(size: float, digits: int = 1) -> str:
    """Write a byte count in binary units: 42949672960 -> "40 GiB", 1610612736 -> "1.5 GiB"."""
    for name, unit in _UNITS:
        if abs(size) >= unit:
            text = f"{size / unit:.{digits}f}".rstrip("0").rstrip(".")
            return f"{text} {name}"
    return f"{int(size)} B"


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


def format_progress(done: float, total: float | None, rate: float | None) -> str:
    """'3.1 of 15.2 GiB, 41 MiB/s' while downloading, '1.2 GiB so far' with no known size."""
    if total:
        name, unit = _unit_for(total)
        line = f"{_in_unit(done, unit)} of {_in_unit(total, unit)} {name}"
    else:
        name, unit = _unit_for(done)
        line = f"{_in_unit(done, unit)} {name} so far"
    if rate:
        name, unit = _unit_for(rate)
        value = rate / unit
        line += f", {value:.0f} {name}/s" if value >= 10 else f", {value:.1f} {name}/s"
    return line


def _unit_for(size: float) -> tuple[str, int]:
    return next(((name, unit) for name, unit in _UNITS if size >= unit), ("B", 1))


def _in_unit(size: float, unit: int) -> str:
    return f"{size / unit:.0f}" if unit == 1 else f"{size / unit:.1f}"


def format_seconds(seconds: float) -> str:
    """A duration as '12 s', '5 min', '3 h' or '2 d': as precise as a person needs."""
    seconds = max(0, int(seconds))
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    if seconds < 172800:
        return f"{seconds // 3600} h"
    return f"{seconds // 86400} d"


def plural(count: int, noun: str) -> str:
    """Write the noun as the count needs it: "GPU" for 1, "GPUs" otherwise."""
    return noun if count == 1 else f"{noun}s"


def count_of(count: int, noun: str) -> str:
    """Write "1 GPU" or "2 GPUs"."""
    return f"{count} {plural(count, noun)}"


# A refusal lists what there is, but not a whole fleet: past this many, it says how many more.
NAMES_LISTED = 20


def no_such(kind: str, name: str, known: Sequence[str]) -> str:
    """A refusal that names what was asked and what there is: "no node 'ghost' (nodes:
    node01, node02)"; a long list is cut at NAMES_LISTED."""
    shown = ", ".join(known[:NAMES_LISTED]) or "none"
    if len(known) > NAMES_LISTED:
        shown += f" and {len(known) - NAMES_LISTED} more"
    return f"no {kind} {name!r} ({kind}s: {shown})"
