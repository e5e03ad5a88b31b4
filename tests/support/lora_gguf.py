"""A LoRA adapter for the SmolLM2 demo model, made the way llama.cpp's convert_lora_to_gguf.py
writes one: there is no LoRA for the demo model on PyPI, so tests make their own.

``lora_a``/``lora_b`` pairs for the attention's query and value weights of every block, with
deterministic random values large enough that greedy answers change; two seeds give two
adapters that differ from the base and from each other. ``bench/lora.py`` writes its
adapters with it too.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy

# SmolLM2-135M: 30 blocks of width 576; the value projection goes to 3 KV heads of 64.
BLOCKS, WIDTH, KV_WIDTH = 30, 576, 192
RANK = 8
# Each value of lora_a and lora_b: with alpha == RANK the update B·A has entries of about
# sqrt(RANK)·STD², near the size of the model's own weights.
STD = 0.08


def write_lora_gguf(path: Path, seed: int, *, blocks: int = BLOCKS) -> Path:
    """Write a LoRA GGUF adapter for SmolLM2-135M to ``path``; return it."""
    random = numpy.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), arch="llama")
    writer.add_type("adapter")  # general.type
    writer.add_string("adapter.type", "lora")
    writer.add_float32("adapter.lora.alpha", float(RANK))
    for block in range(blocks):
        for name, out in (("attn_q", WIDTH), ("attn_v", KV_WIDTH)):
            # numpy's shapes are ggml's reversed: lora_a is [WIDTH, RANK] to ggml, lora_b
            # [RANK, out], as llama.cpp checks against the base tensor [WIDTH, out].
            a = random.normal(0, STD, (RANK, WIDTH)).astype(numpy.float32)
            b = random.normal(0, STD, (out, RANK)).astype(numpy.float32)
            writer.add_tensor(f"blk.{block}.{name}.weight.lora_a", a)
            writer.add_tensor(f"blk.{block}.{name}.weight.lora_b", b)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
