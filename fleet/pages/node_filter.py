"""Which nodes a list shows: a filter by state, pool, fabric and a search, and a page of it.

Read from a query string (``?state=unreachable&pool=a&q=gpu1&page=2``) so a view is a URL
to share, and written back the same way, so links and the page's socket say the same
thing. What a query string gets wrong is never an error: it is set aside, said in
``notes``, and the list shows as if it had not been asked.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from urllib.parse import urlencode

from django.db.models import Q
from django.http import QueryDict

from fleet.models import NodeState

PER_PAGE = 50
# Draining is a flag beside the state, but an operator looks for it as one.
DRAINING = "draining"
STATES = (*NodeState.values, DRAINING)
SEARCH_MAX = 100
NAME_MAX = 64  # a pool's or a fabric's name, as the catalog holds it


@dataclass(frozen=True)
class NodeFilter:
    """What a list of nodes is narrowed to, and which page of it is shown."""

    state: str = ""
    pool: str = ""
    fabric: str = ""
    search: str = ""
    page: int = 1
    # What the query string asked that could not be done, in words, and what was done.
    notes: tuple[str, ...] = ()

    @classmethod
    def from_query(cls, query: str | QueryDict) -> NodeFilter:
        """Read a query string; anything not understood is noted and left out."""
        params = QueryDict(query) if isinstance(query, str) else query
        notes = []
        state = params.get("state", "").strip()
        if state and state not in STATES:
            notes.append(f"{state[:40]!r} is not a node state (choose {_choices()}); showing all")
            state = ""
        page_text = params.get("page", "").strip()
        page = 1
        if page_text:
            if page_text.isdigit() and int(page_text) >= 1:
                page = int(page_text)
            else:
                notes.append(f"page {page_text[:20]!r} is not a page number; showing the first")
        return cls(
            state=state,
            pool=_text(params.get("pool", ""), NAME_MAX),
            fabric=_text(params.get("fabric", ""), NAME_MAX),
            search=_text(params.get("q", ""), SEARCH_MAX),
            page=page,
            notes=tuple(notes),
        )

    @property
    def narrowed(self) -> bool:
        return bool(self.state or self.pool or self.fabric or self.search)

    def where(self) -> Q:
        """The filter as a database condition (Q() when nothing is asked)."""
        where = Q()
        if self.state == DRAINING:
            where &= Q(draining=True)
        elif self.state:
            where &= Q(state=self.state)
        if self.pool:
            where &= Q(pool=self.pool)
        if self.fabric:
            # The fabrics a node's register said it can use (protocol UsableFabric).
            where &= Q(inventory__fabrics__contains=[{"name": self.fabric}])
        if self.search:
            where &= Q(id__icontains=self.search) | Q(address__icontains=self.search)
        return where

    def query(self, **changes) -> str:
        """This filter as a query string (page 1 and empty fields left out), with changes."""
        chosen = replace(self, **changes)
        pairs = [
            ("state", chosen.state),
            ("pool", chosen.pool),
            ("fabric", chosen.fabric),
            ("q", chosen.search),
            ("page", "" if chosen.page == 1 else str(chosen.page)),
        ]
        return urlencode([(name, value) for name, value in pairs if value])

    def on_page(self, page: int, pages: int) -> NodeFilter:
        """The filter on ``page``, within 1..pages; a page past the end shows the last."""
        if page <= pages:
            return replace(self, page=max(1, page))
        note = f"page {page} is past the last ({pages}); showing the last"
        return replace(self, page=pages, notes=(*self.notes, note))


def _text(value: str, limit: int) -> str:
    """A name or search as typed, less control characters (PostgreSQL refuses NUL)."""
    return "".join(char for char in value if char.isprintable()).strip()[:limit]


def _choices() -> str:
    return ", ".join(STATES[:-1]) + f" or {STATES[-1]}"
