"""The bulk-data codec of the parallel mode: named arrays as safetensors bytes, checked before any array is built.

Trajectories (dicts of arrays) and policy snapshots (torch state_dicts) travel as safetensors: an 8-byte
little-endian header length ``N``, ``N`` bytes of a JSON header ``{name: {"dtype", "shape", "data_offsets": [begin,
end]}, "__metadata__": {str: str}}``, then the byte buffer. ``decode_arrays`` parses and checks that header itself
(``safetensors_header``: its size, the dtypes, shapes and offsets that tile the buffer exactly, no duplicate keys)
before building arrays
with ``np.frombuffer``, so a hostile, truncated or foreign buffer is a ``ProtocolError`` naming the field, and nothing
received is ever unpickled. A ``Schema`` then checks what the arrays mean (required keys, dtypes, a shared ``T``,
finite values).

Also here: ``decode_npz`` for users who hand us ``.npz`` (read with ``allow_pickle=False``), the state_dict
conversions (``encode_state_dict`` / ``decode_state_dict``) and base64 for small payloads inline in JSON.
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import math
import zipfile
import zlib
from typing import Any, Dict, Mapping, Optional, Tuple

import numpy as np
import safetensors.numpy
import torch

from .errors import ProtocolError
from .safetensors_header import (
    CODE_OF,
    DTYPES,
    build_array,
    check_entry,
    check_layout,
    check_metadata,
    read_header,
)
from .schema import Schema

MAX_BYTES = 256 << 20
"""The default cap on an encoded payload (a decoded one is never larger)."""
INLINE_MAX_BYTES = 1 << 20
"""The default cap on a payload carried inline in JSON (the decoded bytes)."""
TREE_KEY = "nervex.tree"
"""The ``__metadata__`` key under which ``state_dict_to_arrays`` records the nesting and the non-tensor values."""

_TORCH_DTYPES = {torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64}
_TORCH_DTYPES |= {torch.float16, torch.float32, torch.float64}
_MAX_TREE_DEPTH = 64

Tree = Mapping[str, Any]


# ---------------------------------------------------------------------------------------------------------- encoding


def encode_arrays(arrays: Tree, metadata: Optional[Mapping[str, str]] = None) -> bytes:
    """Safetensors bytes of named arrays.

    Args:
        arrays: ``{name: array}`` of NumPy arrays or torch tensors, possibly nested dicts of them (flattened with
            ``/``-joined keys: ``{'prev_state': {'h': x}}`` is stored as ``'prev_state/h'``).
        metadata: Text stored in the header's ``__metadata__`` (``decode_arrays_and_metadata`` returns it).

    Returns:
        The encoded bytes.

    Raises:
        TypeError: a leaf that is not an array or tensor, a dtype outside the codec's set (bool, uint8, int8-64,
            float16-64; bfloat16 and complex are not in it), or metadata that is not ``{str: str}``.
        ValueError: two keys that flatten to the same name, an empty key, or the reserved key ``'__metadata__'``.
    """
    flat = {name: _to_numpy(name, leaf) for name, leaf in flatten_arrays(arrays).items()}
    if metadata is not None and not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        raise TypeError("encode_arrays metadata must map str to str (encode other values as JSON strings)")
    return safetensors.numpy.save(flat, metadata=dict(metadata) if metadata else None)


def flatten_arrays(tree: Tree) -> Dict[str, Any]:
    """``tree`` with nested dicts flattened to ``/``-joined keys; the leaves are returned as they are.

    Raises:
        ValueError: two keys that flatten to the same name, an empty key, or the reserved key ``'__metadata__'``.
        TypeError: a key that is not a string.
    """
    flat: Dict[str, Any] = {}
    _flatten_into(tree, "", flat)
    return flat


def _flatten_into(tree: Tree, prefix: str, flat: Dict[str, Any]) -> None:
    for key, value in tree.items():
        if not isinstance(key, str) or not key:
            raise TypeError(f"array names must be non-empty strings, got {key!r} under {prefix or 'the root'!r}")
        name = f"{prefix}/{key}" if prefix else key
        if isinstance(value, Mapping):
            _flatten_into(value, name, flat)
            continue
        if name in flat or name == "__metadata__":
            raise ValueError(f"array name {name!r} is used twice (or reserved) after flattening nested keys with '/'")
        flat[name] = value


def _to_numpy(name: str, leaf: Any) -> np.ndarray:
    """A contiguous little-endian NumPy array of ``leaf`` (a tensor is detached and moved to the CPU)."""
    if isinstance(leaf, torch.Tensor):
        if leaf.dtype not in _TORCH_DTYPES or leaf.layout != torch.strided:
            raise TypeError(
                f"array {name!r}: a {leaf.layout} tensor of {leaf.dtype} is not supported by the codec; "
                "use a dense tensor of bool, uint8, int8-64 or float16-64 (cast bfloat16 to float32)"
            )
        leaf = leaf.detach().cpu().contiguous().numpy()
    if not isinstance(leaf, np.ndarray):
        raise TypeError(f"array {name!r} is a {type(leaf).__name__}; expected a np.ndarray or torch.Tensor")
    if (leaf.dtype.kind, leaf.dtype.itemsize) not in CODE_OF:
        raise TypeError(
            f"array {name!r} has dtype {leaf.dtype}; the codec takes bool, uint8, int8-64 and float16-64 "
            f"({', '.join(DTYPES)} in safetensors)"
        )
    return np.asarray(leaf, dtype=leaf.dtype.newbyteorder("<"), order="C")  # ascontiguousarray makes 0-d 1-d


# ---------------------------------------------------------------------------------------------------------- decoding


def decode_arrays(data: bytes, schema: Optional[Schema] = None, max_bytes: int = MAX_BYTES) -> Dict[str, np.ndarray]:
    """The arrays of a safetensors buffer, after checking the buffer (and ``schema``, if given).

    Args:
        data: The bytes, from the network or the storage path.
        schema: What the arrays must hold, checked after decoding.
        max_bytes: The largest ``data`` accepted.

    Returns:
        ``{name: array}``, flat (see ``unflatten_arrays``); each array is a writable, native-endian copy.

    Raises:
        ProtocolError: 413 for ``data`` over ``max_bytes``; 400, naming the field, for anything malformed (see the
            module docstring) or against ``schema``.
    """
    return decode_arrays_and_metadata(data, schema, max_bytes)[0]


def decode_arrays_and_metadata(
    data: bytes, schema: Optional[Schema] = None, max_bytes: int = MAX_BYTES
) -> Tuple[Dict[str, np.ndarray], Dict[str, str]]:
    """Like ``decode_arrays``, and also the header's ``__metadata__`` (``{}`` when absent)."""
    header, buffer_start = read_header(data, max_bytes)
    metadata = check_metadata(header.pop("__metadata__", {}))
    buffer_len = len(data) - buffer_start
    entries = [check_entry(name, entry, buffer_len) for name, entry in header.items()]
    check_layout(entries, buffer_len)
    arrays = {entry.name: build_array(data, buffer_start, entry) for entry in entries}
    if schema is not None:
        schema.validate(arrays)
    return arrays, metadata


def unflatten_arrays(flat: Mapping[str, Any]) -> Dict[str, Any]:
    """Nested dicts from ``/``-joined keys (the inverse of ``flatten_arrays``).

    Raises:
        ProtocolError: 400 when a name is both an array and a prefix of another (``'a'`` and ``'a/b'``).
    """
    tree: Dict[str, Any] = {}
    for name, value in flat.items():
        *parents, leaf = name.split("/")
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ProtocolError(400, f"{name!r} nests under an array of the same name", field=name)
        if leaf in node:
            raise ProtocolError(400, f"{name!r} is both an array and a group of arrays", field=name)
        node[leaf] = value
    return tree


def decode_npz(data: bytes, max_bytes: int = MAX_BYTES) -> Dict[str, np.ndarray]:
    """The arrays of ``.npz`` bytes a user hands us, read without unpickling.

    Args:
        data: The bytes of an ``np.savez`` (or ``np.savez_compressed``) file.
        max_bytes: The cap on ``data`` and on the arrays' total uncompressed size.

    Returns:
        ``{name: array}``.

    Raises:
        ProtocolError: 413 over the cap; 400 for bytes that are not an ``.npz``, and, naming the field, an object
            array (which only a pickle could restore) or a dtype outside the codec's set.
    """
    if len(data) > max_bytes:
        raise ProtocolError(413, f"npz of {len(data)} bytes is over the cap of {max_bytes}", field="data")
    if bytes(data[:4]) not in (b"PK\x03\x04", b"PK\x05\x06"):  # what np.load takes for an .npz and nothing else
        raise ProtocolError(400, "not an .npz file (no zip signature at the start)", field="data")
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            unpacked = sum(info.file_size for info in archive.infolist())
        if unpacked > max_bytes:
            raise ProtocolError(413, f"npz unpacks to {unpacked} bytes, over the cap of {max_bytes}", field="data")
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            return {name: _load_npz_member(npz, name) for name in npz.files}
    except (zipfile.BadZipFile, EOFError, OSError, ValueError) as e:
        raise ProtocolError(400, f"not a readable .npz file: {e}", field="data") from None


def _load_npz_member(npz: Any, name: str) -> np.ndarray:
    try:
        array = npz[name]
    except ValueError as e:  # numpy refuses object arrays when allow_pickle=False
        raise ProtocolError(
            400, f"array {name!r} is not a plain array (an object array needs a pickle): {e}", name
        ) from None
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError) as e:
        raise ProtocolError(400, f"array {name!r} is corrupt: {e}", field=name) from None
    if not isinstance(array, np.ndarray):  # a zip member that is not an .npy: NpzFile hands back its raw bytes
        raise ProtocolError(400, f"member {name!r} is not an .npy array", field=name)
    if (array.dtype.kind, array.dtype.itemsize) not in CODE_OF or array.dtype.names is not None:
        raise ProtocolError(400, f"array {name!r} has dtype {array.dtype}, not one the codec takes", field=name)
    return array


# ------------------------------------------------------------------------------------------------------- state_dicts


def state_dict_to_arrays(state_dict: Tree) -> Tuple[Dict[str, np.ndarray], Dict[str, str]]:
    """The tensors of a (possibly nested) state_dict and the metadata that restores the rest.

    Tensors (and NumPy arrays) become arrays named by their ``/``-joined path (``'0.weight'`` for a model,
    ``'state/0/exp_avg'`` for an optimizer); the nesting (dicts with str or int keys, lists, tuples) and the plain
    values (bool, int, float, str, None: ``train_iter``, an optimizer's ``lr`` and ``betas``) go to
    ``metadata[TREE_KEY]`` as JSON.

    Raises:
        TypeError: a value of another type (a ``np.float32``: use ``.item()``), or a tensor the codec does not take.
        ValueError: two paths that join to the same name.
    """
    arrays: Dict[str, np.ndarray] = {}
    tree = _to_tree(state_dict, "", arrays)
    return arrays, {TREE_KEY: json.dumps(tree)}


def _to_tree(value: Any, path: str, arrays: Dict[str, np.ndarray]) -> Dict[str, Any]:
    if isinstance(value, (torch.Tensor, np.ndarray)):
        if path in arrays or not path:
            raise ValueError(f"state_dict path {path!r} is used twice or empty after joining keys with '/'")
        arrays[path] = _to_numpy(path, value)
        return {"tensor" if isinstance(value, torch.Tensor) else "array": path}
    if isinstance(value, Mapping):
        if not all(isinstance(k, str) or (isinstance(k, int) and not isinstance(k, bool)) for k in value):
            raise TypeError(f"state_dict keys under {path or 'the root'!r} must be str or int, got {list(value)}")
        items = [[k, _to_tree(v, f"{path}/{k}" if path else str(k), arrays)] for k, v in value.items()]
        return {"dict": items}
    if isinstance(value, (list, tuple)):
        items = [_to_tree(v, f"{path}/{i}" if path else str(i), arrays) for i, v in enumerate(value)]
        return {"list" if isinstance(value, list) else "tuple": items}
    if value is None or isinstance(value, (bool, int, float, str)):
        return {"value": value}
    raise TypeError(
        f"state_dict value at {path!r} is a {type(value).__name__}; expected tensors, arrays, dicts, lists, tuples "
        "and bool/int/float/str/None"
    )


def arrays_to_state_dict(arrays: Mapping[str, np.ndarray], metadata: Optional[Mapping[str, str]] = None) -> Tree:
    """The inverse of ``state_dict_to_arrays``: torch tensors (NumPy arrays where the original held arrays) in place.

    Without ``metadata[TREE_KEY]`` (a plain safetensors file), the result is ``{name: tensor}``.

    Raises:
        ProtocolError: 400 (field ``'__metadata__.nervex.tree'``) for a tree that is not what
            ``state_dict_to_arrays`` writes, that names a missing array, or that leaves an array unused.
    """
    if metadata is None or TREE_KEY not in metadata:
        return {name: torch.from_numpy(array) for name, array in arrays.items()}
    try:
        tree = json.loads(metadata[TREE_KEY])
    except (ValueError, RecursionError) as e:
        raise _tree_error(f"not JSON: {e}") from None
    used: Dict[str, int] = {}
    state_dict = _from_tree(tree, arrays, used, 0)
    unused = sorted(set(arrays) - set(used))
    if unused:
        raise _tree_error(f"arrays {unused} are not part of the state_dict")
    if not isinstance(state_dict, dict):
        raise _tree_error("the root must be a dict")
    return state_dict


def _from_tree(node: Any, arrays: Mapping[str, np.ndarray], used: Dict[str, int], depth: int) -> Any:
    if depth > _MAX_TREE_DEPTH or not isinstance(node, dict) or len(node) != 1:
        raise _tree_error(f"a node must be a one-key object within depth {_MAX_TREE_DEPTH}, found {node!r:.80}")
    ((tag, body),) = node.items()
    if tag in ("tensor", "array"):
        if not isinstance(body, str) or body not in arrays or body in used:
            raise _tree_error(f"{tag} {body!r} is missing from the arrays or used twice")
        used[body] = 1
        return torch.from_numpy(arrays[body]) if tag == "tensor" else arrays[body]
    if tag == "value" and (body is None or isinstance(body, (bool, int, float, str))):
        return body
    if tag in ("list", "tuple") and isinstance(body, list):
        items = [_from_tree(item, arrays, used, depth + 1) for item in body]
        return items if tag == "list" else tuple(items)
    if tag == "dict" and isinstance(body, list):
        return dict(_tree_item(item, arrays, used, depth) for item in body)
    raise _tree_error(f"unknown node {tag!r} or a body of the wrong type")


def _tree_item(item: Any, arrays: Mapping[str, np.ndarray], used: Dict[str, int], depth: int) -> Tuple[Any, Any]:
    if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], (str, int))):
        raise _tree_error(f"a dict item must be [str or int key, node], found {item!r:.80}")
    if isinstance(item[0], bool):
        raise _tree_error("a dict key must be str or int, found a bool")
    return item[0], _from_tree(item[1], arrays, used, depth + 1)


def _tree_error(problem: str) -> ProtocolError:
    return ProtocolError(400, f"state_dict tree in the metadata: {problem}", field=f"__metadata__.{TREE_KEY}")


def encode_state_dict(state_dict: Tree) -> bytes:
    """Safetensors bytes of a (possibly nested) state_dict; see ``state_dict_to_arrays``."""
    arrays, metadata = state_dict_to_arrays(state_dict)
    return encode_arrays(arrays, metadata)


def decode_state_dict(data: bytes, max_bytes: int = MAX_BYTES) -> Tree:
    """The state_dict ``encode_state_dict`` encoded (or ``{name: tensor}`` of a plain safetensors buffer).

    Raises:
        ProtocolError: as ``decode_arrays`` and ``arrays_to_state_dict``.
    """
    arrays, metadata = decode_arrays_and_metadata(data, max_bytes=max_bytes)
    return arrays_to_state_dict(arrays, metadata)


# ------------------------------------------------------------------------------------------------------------ inline


def to_inline(data: bytes) -> str:
    """Standard base64 of ``data``, to carry a small payload inside a JSON message."""
    return base64.b64encode(data).decode("ascii")


def from_inline(text: str, max_bytes: int = INLINE_MAX_BYTES, field: str = "inline") -> bytes:
    """The bytes ``to_inline`` encoded.

    Args:
        text: The base64 text from a JSON message.
        max_bytes: The largest decoded payload accepted (checked on the text's length before decoding).
        field: The message field ``text`` came from, for errors.

    Raises:
        ProtocolError: 413 over the cap; 400 for text that is not a string of strict base64.
    """
    if not isinstance(text, str):
        raise ProtocolError(400, f"inline payload must be a base64 string, got {type(text).__name__}", field=field)
    if len(text) > 4 * math.ceil(max_bytes / 3):
        raise ProtocolError(413, f"inline payload of {len(text)} base64 characters is over {max_bytes} bytes", field)
    try:
        data = base64.b64decode(text.encode("ascii"), validate=True)
    except (UnicodeEncodeError, binascii.Error) as e:
        raise ProtocolError(400, f"inline payload is not base64: {e}", field=field) from None
    if len(data) > max_bytes:
        raise ProtocolError(413, f"inline payload of {len(data)} bytes is over the cap of {max_bytes}", field=field)
    return data
