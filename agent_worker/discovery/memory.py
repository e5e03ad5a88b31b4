"""Memory, read fresh on every call: a VM given more RAM is noticed without a restart."""

from __future__ import annotations

from typing import NamedTuple

import psutil


class Memory(NamedTuple):
    total: int
    used: int
    available: int


def read_memory() -> Memory:
    """Read /proc/meminfo; `used` is what the kernel could not hand back (total - available)."""
    vm = psutil.virtual_memory()
    return Memory(total=vm.total, used=max(vm.total - vm.available, 0), available=vm.available)
