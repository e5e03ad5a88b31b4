"""Reading a client's JSON body field by field: each wrong shape is a 400 naming the field.

``where`` is the field's path as the client wrote it (``messages[2].content[0].source``),
so the answer says exactly what to change.
"""

from __future__ import annotations

import math
from typing import Any, NoReturn

from router import errors


def refuse(where: str, message: str) -> NoReturn:
    raise errors.invalid_field(where, message)


def kind(value: Any) -> str:
    """The JSON name of a value's type, for messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object" if isinstance(value, dict) else type(value).__name__


def obj(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        refuse(where, f"`{where}` must be an object; it is {kind(value)}.")
    return value


def array(value: Any, where: str, *, empty: bool = True) -> list[Any]:
    if not isinstance(value, list):
        refuse(where, f"`{where}` must be an array; it is {kind(value)}.")
    if not value and not empty:
        refuse(where, f"`{where}` must not be empty.")
    return value


def text(value: Any, where: str) -> str:
    if not isinstance(value, str):
        refuse(where, f"`{where}` must be a string; it is {kind(value)}.")
    return value


def number(value: Any, where: str) -> int | float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        refuse(where, f"`{where}` must be a number; it is {kind(value)}.")
    if isinstance(value, float) and not math.isfinite(value):
        refuse(where, f"`{where}` must be a finite number.")
    return value


def count(value: Any, where: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        refuse(where, f"`{where}` must be a whole number of at least {minimum}.")
    return value


def flag(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        refuse(where, f"`{where}` must be true or false; it is {kind(value)}.")
    return value


def one_of(value: Any, where: str, allowed: tuple[str, ...], fix: str = "") -> str:
    """A string out of ``allowed``; ``fix`` says what to do instead of the others."""
    if value not in allowed or not isinstance(value, str):
        shown = repr(value) if isinstance(value, str) else kind(value)
        refuse(where, f"`{where}` must be one of {', '.join(allowed)}; it is {shown}.{fix}")
    return value


def texts(value: Any, where: str) -> list[str]:
    """A string or an array of strings, as an array (``stop`` and its kin)."""
    if isinstance(value, str):
        return [value]
    return [text(item, f"{where}[{i}]") for i, item in enumerate(array(value, where))]
