"""The safetensors layout, read from untrusted bytes: the header parsed and checked before any array is built.

A safetensors buffer is an 8-byte little-endian header length ``N``, ``N`` bytes of a JSON header ``{name: {"dtype",
"shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}}``, then the byte buffer. Everything here raises
``ProtocolError`` (400, or 413 for a payload over its cap) naming the field: a size over the caps, a header that is not
a JSON object or repeats a key, an unknown dtype, a shape or offsets that do not match, tensors that do not tile the
buffer exactly, a BOOL byte other than 0 and 1. ``nervex.system.comm.codec`` builds on it.
"""

from __future__ import annotations

import json
import math
from typing import Any, Dict, List, NamedTuple, Sequence, Tuple

import numpy as np

from .errors import ProtocolError

HEADER_MAX_BYTES = 1 << 20
"""The cap on the JSON header of a safetensors buffer."""
DTYPES: Dict[str, np.dtype] = {
    code: np.dtype(name)
    for code, name in zip(
        ("BOOL", "U8", "I8", "I16", "I32", "I64", "F16", "F32", "F64"),
        ("bool", "<u1", "<i1", "<i2", "<i4", "<i8", "<f2", "<f4", "<f8"),
    )
}
"""The safetensors dtype codes nervex reads and writes, and their little-endian NumPy dtypes."""
CODE_OF = {(dtype.kind, dtype.itemsize): code for code, dtype in DTYPES.items()}
"""A NumPy dtype's ``(kind, itemsize)`` -> its safetensors code."""
_ENTRY_KEYS = {"dtype", "shape", "data_offsets"}
_MAX_NDIM = 32
_MAX_ARRAY_BYTES = int(np.iinfo(np.intp).max)  # NumPy's limit on an array's size, empty dimensions left out


class TensorEntry(NamedTuple):
    """One tensor of a checked header: its name, dtype, shape and byte range in the buffer."""

    name: str
    dtype: np.dtype
    shape: Tuple[int, ...]
    begin: int
    end: int


class _DuplicateKey(Exception):
    def __init__(self, key: str):
        super().__init__(key)
        self.key = key


def read_header(data: bytes, max_bytes: int) -> Tuple[Dict[str, Any], int]:
    """The parsed JSON header and the offset of the byte buffer."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ProtocolError(400, f"expected bytes, got {type(data).__name__}", field="data")
    if len(data) > max_bytes:
        raise ProtocolError(413, f"payload of {len(data)} bytes is over the cap of {max_bytes}", field="data")
    if len(data) < 8:
        raise ProtocolError(400, f"{len(data)} bytes is shorter than the 8-byte safetensors header length", "data")
    size = int.from_bytes(data[:8], "little")
    if size > HEADER_MAX_BYTES:
        raise ProtocolError(
            400, f"safetensors header length {size} is over the cap of {HEADER_MAX_BYTES} (not safetensors?)", "header"
        )
    if size > len(data) - 8:
        raise ProtocolError(
            400,
            f"safetensors header length {size} runs past the end of the {len(data)}-byte payload (truncated?)",
            "header",
        )
    try:
        header = json.loads(bytes(data[8 : 8 + size]).decode("utf-8"), object_pairs_hook=_refuse_duplicates)
    except _DuplicateKey as e:
        raise ProtocolError(400, f"key {e.key!r} appears twice in the safetensors header", field=e.key) from None
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise ProtocolError(400, f"safetensors header is not UTF-8 JSON: {e}", field="header") from None
    if not isinstance(header, dict):
        raise ProtocolError(400, f"safetensors header is a JSON {type(header).__name__}, not an object", "header")
    return header, 8 + size


def _refuse_duplicates(pairs: List[Tuple[str, Any]]) -> Dict[str, Any]:
    result: Dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise _DuplicateKey(key)
        result[key] = value
    return result


def check_metadata(metadata: Any) -> Dict[str, str]:
    """The header's ``__metadata__`` if it is an object of strings, else a 400."""
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise ProtocolError(400, "safetensors __metadata__ must be an object of strings", field="__metadata__")
    return metadata


def check_entry(name: str, entry: Any, buffer_len: int) -> TensorEntry:
    """One header entry as a ``TensorEntry``, after checking its keys, dtype, shape and offsets."""
    if not name:
        raise ProtocolError(400, "safetensors header has an empty tensor name", field="header")
    if not isinstance(entry, dict) or set(entry) != _ENTRY_KEYS:
        found = sorted(entry) if isinstance(entry, dict) else type(entry).__name__
        raise ProtocolError(400, f"tensor {name!r} must have exactly {sorted(_ENTRY_KEYS)}, found {found}", name)
    dtype = DTYPES.get(entry["dtype"]) if isinstance(entry["dtype"], str) else None
    if dtype is None:
        raise ProtocolError(400, f"dtype {entry['dtype']!r} is not one of {', '.join(DTYPES)}", field=f"{name}.dtype")
    shape = entry["shape"]
    if not isinstance(shape, list) or len(shape) > _MAX_NDIM or not all(_is_count(n) for n in shape):
        raise ProtocolError(
            400, f"shape {shape!r} is not a list of at most {_MAX_NDIM} non-negative integers", f"{name}.shape"
        )
    offsets = entry["data_offsets"]
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_count(n) for n in offsets)):
        raise ProtocolError(400, f"data_offsets {offsets!r} is not [begin, end]", field=f"{name}.data_offsets")
    begin, end = offsets
    if not begin <= end <= buffer_len:
        raise ProtocolError(
            400, f"data_offsets [{begin}, {end}] lie outside the {buffer_len}-byte buffer", f"{name}.data_offsets"
        )
    needed = math.prod(shape) * dtype.itemsize
    if needed != end - begin:
        raise ProtocolError(
            400,
            f"shape {shape} of {entry['dtype']} needs {needed} bytes, data_offsets [{begin}, {end}] span {end - begin}",
            field=f"{name}.data_offsets",
        )
    if math.prod(n for n in shape if n) * dtype.itemsize > _MAX_ARRAY_BYTES:
        # an empty array (a 0 in its shape, its offsets span 0 bytes) whose other dimensions NumPy cannot hold
        raise ProtocolError(400, f"shape {shape} is too large for any array, even an empty one", f"{name}.shape")
    return TensorEntry(name, dtype, tuple(shape), begin, end)


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def check_layout(entries: Sequence[TensorEntry], buffer_len: int) -> None:
    """The tensors must tile the buffer: no overlap, no gap, no trailing bytes."""
    cursor = 0
    for entry in sorted(entries, key=lambda e: (e.begin, e.end, e.name)):
        if entry.begin != cursor:
            problem = "overlaps the tensor before it" if entry.begin < cursor else f"leaves a gap at byte {cursor}"
            raise ProtocolError(
                400, f"data_offsets [{entry.begin}, {entry.end}] {problem}", field=f"{entry.name}.data_offsets"
            )
        cursor = entry.end
    if cursor != buffer_len:
        raise ProtocolError(400, f"{buffer_len - cursor} bytes after the last tensor belong to none", field="data")


def build_array(data: bytes, buffer_start: int, entry: TensorEntry) -> np.ndarray:
    """A writable native-endian copy of one tensor's bytes."""
    count = math.prod(entry.shape)
    if count == 0:
        return np.empty(entry.shape, dtype=entry.dtype.newbyteorder("="))
    offset = buffer_start + entry.begin
    if entry.dtype == np.bool_:
        raw = np.frombuffer(data, dtype=np.uint8, count=count, offset=offset)
        if raw.max() > 1:
            raise ProtocolError(400, "BOOL tensor holds bytes other than 0 and 1", field=entry.name)
    view = np.frombuffer(data, dtype=entry.dtype, count=count, offset=offset)
    return np.array(view, dtype=entry.dtype.newbyteorder("=")).reshape(entry.shape)


__all__ = [
    "CODE_OF",
    "DTYPES",
    "HEADER_MAX_BYTES",
    "TensorEntry",
    "build_array",
    "check_entry",
    "check_layout",
    "check_metadata",
    "read_header",
]
