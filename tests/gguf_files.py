"""GGUF files written at the shapes a test needs: a header only, or a whole model whose tensor
data is a sparse hole (llama.cpp sizes and places tensors from the header alone)."""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from math import prod
from pathlib import Path

ALIGNMENT = 32
# ggml type number -> (elements per block, bytes per block), for the types tests write.
GGML_TYPES = {"f32": (0, 1, 4), "f16": (1, 1, 2), "q4_0": (2, 32, 18), "q8_0": (8, 32, 34)}


def _string(text: str) -> bytes:
    data = text.encode()
    return struct.pack("<Q", len(data)) + data


def _value(value: object) -> bytes:
    if isinstance(value, bool):
        return struct.pack("<I?", 7, value)
    if isinstance(value, int):
        return struct.pack("<II", 4, value)
    if isinstance(value, float):
        return struct.pack("<If", 6, value)
    if isinstance(value, str):
        return struct.pack("<I", 8) + _string(value)
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return struct.pack("<IIQ", 9, 8, len(value)) + b"".join(_string(i) for i in value)
    if isinstance(value, list):
        return struct.pack("<IIQ", 9, 5, len(value)) + b"".join(struct.pack("<i", i) for i in value)
    raise TypeError(f"no GGUF type for {value!r}")


def write_gguf_header(path: Path, metadata: dict[str, object], version: int = 3) -> Path:
    """Write ``metadata`` as a GGUF header of ``version`` with no tensors; return ``path``."""
    body = b"".join(_string(key) + _value(value) for key, value in metadata.items())
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", version, 0, len(metadata)) + body)
    return path


@dataclass(frozen=True)
class Tensor:
    name: str
    shape: Sequence[int]  # ggml order: the row length first
    kind: str = "f32"

    def nbytes(self) -> int:
        _number, block, size = GGML_TYPES[self.kind]
        return prod(self.shape) // block * size


def write_gguf(path: Path, metadata: dict[str, object], tensors: Sequence[Tensor]) -> Path:
    """Write a GGUF file with ``tensors`` whose data is all zeros, left as a sparse hole so a
    model of gigabytes costs no disk; return ``path``."""
    header = [b"GGUF", struct.pack("<IQQ", 3, len(tensors), len(metadata))]
    header += [_string(key) + _value(value) for key, value in metadata.items()]
    offset = 0
    for tensor in tensors:
        number = GGML_TYPES[tensor.kind][0]
        header.append(_string(tensor.name) + struct.pack("<I", len(tensor.shape)))
        header.append(struct.pack(f"<{len(tensor.shape)}QIQ", *tensor.shape, number, offset))
        offset += -(-tensor.nbytes() // ALIGNMENT) * ALIGNMENT
    data = b"".join(header)
    data += b"\0" * (-len(data) % ALIGNMENT)
    with open(path, "wb") as file:
        file.write(data)
        file.truncate(len(data) + offset)
    return path


def llama_model(
    path: Path,
    *,
    layers: int,
    embedding: int,
    heads: int,
    kv_heads: int,
    feed_forward: int,
    vocab: int,
    context: int,
    kind: str = "q8_0",
    tied: bool = False,
) -> Path:
    """A llama-architecture model of this shape with no vocabulary (llama.cpp's ``none``
    tokenizer with ``vocab`` placeholder tokens): enough for llama-fit-params, not to chat."""
    head = embedding // heads
    metadata: dict[str, object] = {
        "general.architecture": "llama",
        "general.name": f"test-{layers}x{embedding}",
        "llama.block_count": layers,
        "llama.context_length": context,
        "llama.embedding_length": embedding,
        "llama.feed_forward_length": feed_forward,
        "llama.attention.head_count": heads,
        "llama.attention.head_count_kv": kv_heads,
        "llama.attention.layer_norm_rms_epsilon": 1e-5,
        "llama.rope.dimension_count": head,
        "llama.vocab_size": vocab,
        "tokenizer.ggml.model": "none",
    }
    tensors = [Tensor("token_embd.weight", (embedding, vocab), kind)]
    for n in range(layers):
        tensors += [
            Tensor(f"blk.{n}.attn_norm.weight", (embedding,)),
            Tensor(f"blk.{n}.attn_q.weight", (embedding, heads * head), kind),
            Tensor(f"blk.{n}.attn_k.weight", (embedding, kv_heads * head), kind),
            Tensor(f"blk.{n}.attn_v.weight", (embedding, kv_heads * head), kind),
            Tensor(f"blk.{n}.attn_output.weight", (heads * head, embedding), kind),
            Tensor(f"blk.{n}.ffn_norm.weight", (embedding,)),
            Tensor(f"blk.{n}.ffn_gate.weight", (embedding, feed_forward), kind),
            Tensor(f"blk.{n}.ffn_up.weight", (embedding, feed_forward), kind),
            Tensor(f"blk.{n}.ffn_down.weight", (feed_forward, embedding), kind),
        ]
    tensors.append(Tensor("output_norm.weight", (embedding,)))
    if not tied:
        tensors.append(Tensor("output.weight", (embedding, vocab), kind))
    return write_gguf(path, metadata, tensors)
