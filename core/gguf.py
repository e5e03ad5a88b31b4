"""What a GGUF file says about its model, read from its header without loading any tensor.

The header is a list of typed key-value pairs, then one entry per tensor (name, shape, type,
offset), before the tensor data (https://github.com/ggml-org/ggml/blob/master/docs/gguf.md).
Values the caller does not ask for are skipped by their sizes, so even the tokenizer's long
arrays cost only their reads. The agent reads a model's layer count here before a launch;
the catalog reads the whole header to estimate the memory a model needs.
"""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass
from math import prod
from pathlib import Path
from typing import BinaryIO

MAGIC = b"GGUF"
# GGUF value types: their numbers and, for the fixed-size ones, struct formats.
_FIXED = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
          10: "<Q", 11: "<q", 12: "<d"}  # fmt: skip
_STRING, _ARRAY = 8, 9
# A header with more pairs than this is not one llmgw trusts to walk.
_MAX_PAIRS = 1_000_000


# Dimensions one tensor may have in ggml; a header claiming more is not read on.
_MAX_DIMS = 8
_DEFAULT_ALIGNMENT = 32


class GgufError(ValueError):
    """A file that is not a GGUF llmgw can read; the message names the file."""


class GgufIncomplete(GgufError):
    """The bytes given end before the header does: read more of the file and try again."""


@dataclass(frozen=True)
class GgufTensor:
    """One tensor as the header lists it: its name and shape (ggml order, row length first)."""

    name: str
    shape: tuple[int, ...]

    @property
    def elements(self) -> int:
        return prod(self.shape)


@dataclass(frozen=True)
class GgufHeader:
    """A whole header: every scalar value, how long each array is, every tensor, and where
    the tensor data starts (the bytes from there to the end of the file are the weights)."""

    metadata: dict[str, object]
    array_lengths: dict[str, int]
    tensors: tuple[GgufTensor, ...]
    data_start: int

    @property
    def architecture(self) -> str:
        value = self.metadata.get("general.architecture")
        return value if isinstance(value, str) else ""

    def number(self, key: str) -> int:
        """An integer value of the architecture's own keys (``llama.block_count`` for
        ``block_count``); 0 when the header has none."""
        value = self.metadata.get(f"{self.architecture}.{key}")
        return value if isinstance(value, int) and not isinstance(value, bool) else 0

    def tensor(self, name: str) -> GgufTensor | None:
        return next((tensor for tensor in self.tensors if tensor.name == name), None)


def read_header(path: str | Path) -> GgufHeader:
    """Read the whole header of the GGUF file at ``path``."""
    try:
        with open(path, "rb") as file:
            return _header(file, str(path))
    except OSError as err:
        raise GgufError(f"cannot read the GGUF header of {path}: {err}") from err


def read_header_bytes(data: bytes, name: str) -> GgufHeader:
    """Read a header from the first bytes of a file (a ranged download); ``GgufIncomplete``
    when they end before it does. ``name`` (the file's URL) is what errors call it."""
    return _header(io.BytesIO(data), name, available=len(data))


def _header(file: BinaryIO, name: str, available: int | None = None) -> GgufHeader:
    """Parse a header; ``available``: the bytes given are only the file's first ones."""
    try:
        _tensors, pairs = _start(file, name)
        metadata: dict[str, object] = {}
        lengths: dict[str, int] = {}
        for _ in range(pairs):
            key = _string(file)
            (kind,) = _read(file, "<I")
            if kind == _ARRAY:
                item_kind, count = _read(file, "<IQ")
                lengths[key] = count
                _skip_items(file, item_kind, count)
            else:
                metadata[key] = _value(file, kind)
        tensors = []
        for _ in range(_tensors):
            tensor_name = _string(file)
            (dims,) = _read(file, "<I")
            if dims > _MAX_DIMS:
                raise GgufError(f"{name}: tensor {tensor_name} claims {dims} dimensions")
            shape = _read(file, f"<{dims}Q") if dims else ()
            _read(file, "<IQ")  # its type and offset: the data's extent is the file's
            tensors.append(GgufTensor(tensor_name, tuple(shape)))
        alignment = metadata.get("general.alignment", _DEFAULT_ALIGNMENT)
        if not isinstance(alignment, int) or alignment < 1:
            alignment = _DEFAULT_ALIGNMENT
        end = file.tell()
        if available is not None and end > available:
            raise struct.error("a value skipped runs past the bytes given")
    except struct.error as err:
        if available is not None:
            raise GgufIncomplete(f"the first bytes of {name} end inside its header") from err
        raise GgufError(f"cannot read the GGUF header of {name}: {err}") from err
    except UnicodeDecodeError as err:
        raise GgufError(f"cannot read the GGUF header of {name}: {err}") from err
    return GgufHeader(metadata, lengths, tuple(tensors), end + (-end % alignment))


def _start(file: BinaryIO, name: str) -> tuple[int, int]:
    """Check the magic and version; return the counts of tensors and of key-value pairs."""
    magic = file.read(4)
    if 0 < len(magic) < 4 and MAGIC.startswith(magic):
        raise struct.error("the header ends early")
    if magic != MAGIC:
        raise GgufError(f"{name} is not a GGUF file (its first bytes are not 'GGUF')")
    (version,) = _read(file, "<I")
    if version < 2:
        raise GgufError(f"{name} is GGUF version {version}; llmgw reads 2 and later")
    tensors, pairs = _read(file, "<QQ")
    if pairs > _MAX_PAIRS or tensors > _MAX_PAIRS:
        raise GgufError(f"{name} claims {pairs} header entries, which is not plausible")
    return tensors, pairs


def read_metadata(path: str | Path, wanted: set[str]) -> dict[str, object]:
    """Return the scalar values of the ``wanted`` keys that the file's header holds."""
    found: dict[str, object] = {}
    try:
        with open(path, "rb") as file:
            _tensors, pairs = _start(file, str(path))
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
        _skip_items(file, item_kind, count)
    else:
        raise struct.error(f"unknown value type {kind}")


def _skip_items(file: BinaryIO, kind: int, count: int) -> None:
    if kind in _FIXED:
        file.seek(struct.calcsize(_FIXED[kind]) * count, 1)
    else:
        for _ in range(count):
            _skip(file, kind)
