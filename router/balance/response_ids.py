"""Which replica made each Responses API answer, so a conversation goes back to it.

An engine that serves ``/v1/responses`` natively may keep what it answered, and a request
naming ``previous_response_id`` (or ``GET``/``DELETE /v1/responses/{id}``) means only on
the replica that made it. The router notes the id of every such answer it relays, in
memory, the most recent ``KEPT`` of them; a request for an id it does not know, or whose
replica is gone, is refused with the reason rather than sent where it cannot be found.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from typing import NamedTuple

KEPT = 100_000
_RESPONSE_ID = re.compile(rb'"id"\s*:\s*"(resp_[^"\\]{1,200})"')


class MadeBy(NamedTuple):
    replica: str
    model: str


class ResponseIds:
    """Response id -> the replica and model that made it, the most recent ``KEPT``."""

    def __init__(self, kept: int = KEPT) -> None:
        self.kept = kept
        self._made_by: OrderedDict[str, MadeBy] = OrderedDict()

    def note(self, response_id: str, replica: str, model: str) -> None:
        self._made_by[response_id] = MadeBy(replica, model)
        self._made_by.move_to_end(response_id)
        while len(self._made_by) > self.kept:
            self._made_by.popitem(last=False)

    def made_by(self, response_id: str) -> MadeBy | None:
        return self._made_by.get(response_id)

    def forget(self, response_id: str) -> None:
        self._made_by.pop(response_id, None)

    def note_answer(self, data: bytes, replica: str, model: str) -> None:
        """Note the id of a whole Responses answer (or of the first streamed event
        carrying one: ``response.created`` holds the response)."""
        found = _RESPONSE_ID.search(data)
        if found is not None:
            self.note(found.group(1).decode(), replica, model)


def previous_response_id(payload: dict) -> str | None:
    value = payload.get("previous_response_id")
    return value if isinstance(value, str) and value else None
