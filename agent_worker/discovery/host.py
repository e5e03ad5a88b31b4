"""The node's name and operating system."""

from __future__ import annotations

import platform
import socket
from pathlib import Path

OS_RELEASE = Path("/etc/os-release")


def hostname() -> str:
    """Return the node's id: its hostname, which is also its certificate's common name."""
    return socket.gethostname()


def os_name(os_release: Path = OS_RELEASE) -> str:
    """Return the distribution's PRETTY_NAME, or the platform's own words without one."""
    try:
        lines = os_release.read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        key, sep, value = line.partition("=")
        if sep and key.strip() == "PRETTY_NAME" and value.strip():
            return value.strip().strip("\"'")
    return f"{platform.system()} {platform.release()}".strip()


def kernel() -> str:
    """Return the running kernel's release."""
    return platform.release()
