"""How benches print what they measured: percentiles, medians of timed runs, the ratio
against the baseline of the same run, and tables of rows."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

T = TypeVar("T")


def percentile(values: Iterable[float], fraction: float) -> float:
    """The nearest-rank percentile (``fraction`` 0.5 for p50): a value that was measured,
    never an interpolation. ValueError when there is none."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("no values to take a percentile of")
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


def median_seconds(call: Callable[[], T], runs: int = 5) -> tuple[float, T]:
    """The median wall time of ``runs`` calls after one warm-up, and the last call's result."""
    result = call()
    times = []
    for _ in range(runs):
        began = time.perf_counter()
        result = call()
        times.append(time.perf_counter() - began)
    return statistics.median(times), result


def ratio(numerator: float | None, denominator: float | None, spec: str = ".2f") -> str:
    """``numerator / denominator`` written with the format ``spec``; "-" when either is
    missing or the baseline is zero, rather than a crash at the end of a long run."""
    if numerator is None or not denominator:
        return "-"
    return format(numerator / denominator, spec)


def print_rows(header: Sequence[str], rows: Iterable[Sequence[str]]) -> None:
    """A table in Markdown's pipe form, so a run's output pastes into bench/README.md."""
    print(" | ".join(header))
    print(" | ".join("-" * len(h) for h in header))
    for row in rows:
        print(" | ".join(row))
