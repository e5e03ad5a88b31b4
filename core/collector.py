"""Python's garbage collector, run less often: while a block reads the whole fleet, and
in a long-lived server once it has built what it keeps.

Reading every node's reports (at 2,000 nodes, hundreds of thousands of objects of decoded
JSON) while allocating more makes CPython, at its default thresholds, walk them all again
and again in full collections: a quarter to a half of a reconcile pass or of ``llmgw_ctl nodes``
(bench/reconcile_scale.py). What the block leaves behind is collected after it.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

# Allocations between two young collections inside the block (CPython's default: 700);
# the control plane's daphne runs at the same (llmgw_site/asgi.py).
COLLECT_AFTER = 50_000
# A server's thresholds: young collections after COLLECT_AFTER allocations, and young and
# middle collections before the next generation's.
SERVER_THRESHOLDS = (COLLECT_AFTER, 20, 100)


@contextmanager
def collecting_less() -> Iterator[None]:
    """Raise the collector's first threshold while the block runs, then restore it."""
    before = gc.get_threshold()
    gc.set_threshold(max(before[0], COLLECT_AFTER), *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)


def collect_rarely() -> None:
    """In a server, once what it imported and built for its whole life is there: those
    objects kept out of the collector's passes (a full one walks every object), and the
    passes run far less often."""
    gc.freeze()
    gc.set_threshold(*SERVER_THRESHOLDS)
