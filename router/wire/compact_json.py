"""JSON as the router writes it: compact, UTF-8, by one encoder for the process.

``json.dumps`` with any option but its defaults builds a new encoder at every call; on a
router's path (each usage journal line, a stream's body asking for usage, each translated
event) that was a third of what a call cost.
"""

from __future__ import annotations

import json
from typing import Any

_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))


def compact_json(value: Any) -> bytes:
    """``value`` as compact JSON, UTF-8 encoded."""
    return _ENCODER.encode(value).encode()
