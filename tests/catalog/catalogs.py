"""Catalog files for the catalog's tests."""

from __future__ import annotations

import textwrap

# An engine, a pool and two models (one on CPU in the pool, one on two GPUs): six entries.
CATALOG = textwrap.dedent(
    """
    engines:
      - name: llama.cpp
        version: "b6000"
    pools:
      - name: cpu
    models:
      - name: gemma-3-270m
        source: /abs/path/gemma-3-270m-q4_k_m.gguf
        aliases: [gemma]
        profiles:
          - name: cpu
            engine: llama.cpp
            replicas: 1
            gpus_per_rank: 0
            memory: 1GiB
            context: 2048
            pool: cpu
            args: ["--threads", "2"]
      - name: qwen
        source: Qwen/Qwen2.5-7B-Instruct
        profiles:
          - name: tp2
            engine: vllm
            gpus_per_rank: 2
            tensor_parallel: 2
            gpu_memory: 40GiB
            startup_timeout: 10m
    """
)
