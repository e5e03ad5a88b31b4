"""Typed readers for settings that come from the environment."""

from __future__ import annotations

import os
from decimal import Decimal, InvalidOperation
from pathlib import Path


def env_str(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


def env_bool(name: str, default: bool = False) -> bool:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    if value.lower() in {"1", "true", "yes", "on"}:
        return True
    if value.lower() in {"0", "false", "no", "off"}:
        return False
    raise ValueError(f"{name}={value!r} is not a boolean; use true or false")


def env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{name}={value!r} is not a whole number") from None


def env_float(name: str, default: float) -> float:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        return float(value)
    except ValueError:
        raise ValueError(f"{name}={value!r} is not a number") from None


def env_decimal(name: str, default: str = "0") -> Decimal:
    """A non-negative decimal (a price); kept exact, never a float."""
    value = os.environ.get(name) or default
    try:
        number = Decimal(value)
    except InvalidOperation:
        raise ValueError(f"{name}={value!r} is not a number") from None
    if not number.is_finite() or number < 0:
        raise ValueError(f"{name}={value!r}: use a number of 0 or more")
    return number


def env_list(name: str, default: list[str] | None = None) -> list[str]:
    value = os.environ.get(name)
    if not value:
        return list(default or [])
    return [item.strip() for item in value.split(",") if item.strip()]


def llmgw_home() -> Path:
    """Where every piece of local state lives: data, sockets, logs, secrets.

    The default is the checkout's ``var/`` wherever a command is run from, so a
    second terminal finds the same database as `make run`.
    """
    configured = env_str("LLMGW_HOME")
    if configured:
        return Path(configured).resolve()
    return Path(__file__).resolve().parent.parent / "var"
