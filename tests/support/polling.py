"""Waiting for a condition with a deadline that a loaded 2-core machine can meet.

Nothing here asserts how long anything took: a condition not met in time fails the test,
naming what was awaited and the last error the condition raised, if any.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import httpx

PATIENCE = 60.0  # seconds a condition may take on a loaded machine before a test fails
# A server still starting answers these: not yet, rather than a failure.
NOT_YET = (httpx.HTTPError, OSError)


def wait_until(
    condition: Callable[[], Any], timeout: float = PATIENCE, what: str = "",
    interval: float = 0.05,
) -> Any:  # fmt: skip
    """Poll ``condition`` until it returns something truthy, and return that."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while True:
        try:
            value = condition()
        except NOT_YET as exc:
            last_error, value = exc, None
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out after {timeout:g}s waiting for {what or condition}"
                + (f" (last error: {last_error})" if last_error else "")
            )
        time.sleep(interval)


async def wait_until_async(
    condition: Callable[[], Any], timeout: float = 10.0, what: str = "", interval: float = 0.01
) -> Any:
    """``wait_until`` inside an event loop: the loop runs while the condition is not met."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        value = condition()
        if value:
            return value
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what or condition}")
        await asyncio.sleep(interval)
