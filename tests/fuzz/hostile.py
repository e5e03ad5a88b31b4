"""Strategies for hostile input: values of the wrong type or size, and documents built
from a valid one by putting such a value somewhere in it."""

from __future__ import annotations

import copy
import json
from typing import Any

from hypothesis import strategies as st

DEEP = 2_000  # deeper than any JSON or YAML parser should recurse

# Values nobody should send: wrong types, huge numbers, odd text, nesting.
hostile_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([-1, 0, 2**31, 2**63, -(2**63), 10**30]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=40),
    st.sampled_from(["", "\x00", "../../etc/passwd", "ñodé-☃", "a" * 5000, "1e309", "null"]),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=8), st.integers(), max_size=3),
    st.just([[[[[[[[[[[]]]]]]]]]]]),
)


def deep_json(depth: int = DEEP) -> str:
    return "[" * depth + "]" * depth


raw_frames = st.one_of(
    st.text(max_size=200),
    st.sampled_from(
        [
            "",
            "null",
            "[]",
            "{}",
            "1e999999",
            '"text"',
            "{" * DEEP,
            deep_json(),
            '{"type": "nope"}',
            '{"type": null}',
            '{"type": ["register"]}',
            "\ud800",
        ]
    ),  # fmt: skip
)


def paths(document: Any, prefix: tuple = ()) -> list[tuple]:
    """Every place in a JSON document a value could be put, the document itself included."""
    found = [prefix]
    if isinstance(document, dict):
        for key, value in document.items():
            found += paths(value, (*prefix, key))
    elif isinstance(document, list):
        for index, value in enumerate(document):
            found += paths(value, (*prefix, index))
    return found


def put(document: Any, path: tuple, value: Any) -> Any:
    """A copy of ``document`` with ``value`` at ``path`` (replacing what was there)."""
    if not path:
        return value
    changed = copy.deepcopy(document)
    holder = changed
    for step in path[:-1]:
        holder = holder[step]
    holder[path[-1]] = value
    return changed


@st.composite
def mutated(draw, documents: list[Any], extra_keys: tuple[str, ...] = ()) -> Any:
    """One of ``documents`` with a hostile value put in one place, or a key added."""
    document = draw(st.sampled_from(documents))
    if extra_keys and draw(st.booleans()):
        key = draw(st.sampled_from(extra_keys))
        return {**document, key: draw(hostile_values)} if isinstance(document, dict) else document
    path = draw(st.sampled_from(paths(document)))
    return put(document, path, draw(hostile_values))


def dumps(document: Any) -> str:
    return json.dumps(document, ensure_ascii=False)
