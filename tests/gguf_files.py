"""GGUF files with only a header, written at the shapes a test needs (no tensors)."""

from __future__ import annotations

import struct
from pathlib import Path


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
