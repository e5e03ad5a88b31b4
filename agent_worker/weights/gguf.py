"""What a GGUF file says about its model, read from its header without loading any tensor.

The header is a list of typed key-value pairs before the tensor data
(https://github.com/ggml-org/ggml/blob/master/docs/gguf.md). Values the caller does not ask
for are skipped by their sizes, so even the tokenizer's long arrays cost only their reads.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import BinaryIO

MAGIC = b"GGUF"
# GGUF value types: their numbers and, for the fixed-size ones, struct formats.
_FIXED = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
          10: "<Q", 11: "<q", 12: "<d"}  # fmt: skip
_STRING, _ARRAY = 8, 9
# A header with more pairs than this is not one llmgw trusts to walk.
_MAX_PAIRS = 1_000_000


class GgufError(ValueError):
    """A file that is not a GGUF llmgw can read; the message names the file."""


def read_metadata(path: str | Path, wanted: set[str]) -> dict[str, object]:
    """Return the scalar values of the ``wanted`` keys that the file's header holds."""
    found: dict[str, object] = {}
    try:
        with open(path, "rb") as file:
            if file.read(4) != MAGIC:
                raise GgufError(f"{path} is not a GGUF file (its first bytes are not 'GGUF')")
            (version,) = _read(file, "<I")
            if version < 2:
                raise GgufError(f"{path} is GGUF version {version}; llmgw reads 2 and later")
            _tensors, pairs = _read(file, "<QQ")
            if pairs > _MAX_PAIRS:
                raise GgufError(f"{path} claims {pairs} header entries, which is not plausible")
            for _ in range(pairs):
                key = _string(file)
                (kind,) = _read(file, "<I")
                if key in wanted and kind != _ARRAY:
                    found[key] = _value(file, kind)
                    if len(found) == len(wanted):
                        break
                else:
                    _skip(file, kind)
    except (OSError, struct.error, UnicodeDecodeError) as err:
        raise GgufError(f"cannot read the GGUF header of {path}: {err}") from err
    return found


def block_count(path: str | Path) -> int | None:
    """The number of transformer blocks (layers) of the model, if its header says."""
    architecture = read_metadata(path, {"general.architecture"}).get("general.architecture")
    if not isinstance(architecture, str):
        return None
    key = f"{architecture}.block_count"
    count = read_metadata(path, {key}).get(key)
    return count if isinstance(count, int) and count > 0 else None


def _read(file: BinaryIO, layout: str) -> tuple:
    size = struct.calcsize(layout)
    data = file.read(size)
    if len(data) != size:
        raise struct.error("the header ends early")
    return struct.unpack(layout, data)


def _string(file: BinaryIO) -> str:
    (length,) = _read(file, "<Q")
    data = file.read(length)
    if len(data) != length:
        raise struct.error("the header ends early")
    return data.decode()


def _value(file: BinaryIO, kind: int) -> object:
    if kind == _STRING:
        return _string(file)
    if kind in _FIXED:
        return _read(file, _FIXED[kind])[0]
    raise struct.error(f"unknown value type {kind}")


def _skip(file: BinaryIO, kind: int) -> None:
    if kind == _STRING:
        (length,) = _read(file, "<Q")
        file.seek(length, 1)
    elif kind in _FIXED:
        file.seek(struct.calcsize(_FIXED[kind]), 1)
    elif kind == _ARRAY:
        item_kind, count = _read(file, "<IQ")
        if item_kind in _FIXED:
            file.seek(struct.calcsize(_FIXED[item_kind]) * count, 1)
        else:
            for _ in range(count):
                _skip(file, item_kind)
    else:
        raise struct.error(f"unknown value type {kind}")
