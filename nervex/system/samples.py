"""Samples (what a policy's Adder emits) as one safetensors file: the unit an actor hands to the learner.

A collect task yields a list of samples, each a dict of the same keys: arrays (``obs``), NumPy scalars (``action``),
Python numbers and booleans (``terminated``), torch tensors, and nested dicts of them (``prev_state: {'h', 'c'}``).
``encode_samples`` stacks every leaf over the samples into one array with a leading axis of ``N`` and records, in the
file's metadata, ``N`` and the leaf's kind, so ``decode_samples`` gives back samples of the same types: the replay
buffer and the learner see exactly what the serial trainer would have given them.

Decoding trusts nothing: the buffer is checked by ``codec.decode_arrays``, then every array must be a leaf the
metadata names, of the stated kind, with ``N`` rows, and free of NaN and infinities (a NaN reward is a 400 naming
``reward``, not a poisoned replay buffer).
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch

from .comm.codec import MAX_BYTES, decode_arrays_and_metadata, encode_arrays, flatten_arrays, unflatten_arrays
from .comm.errors import ProtocolError

SAMPLES_KEY = "nervex.samples"
"""The ``__metadata__`` key holding ``{"n": N, "kinds": {leaf: kind}}``."""
KINDS = ("ndarray", "numpy", "tensor", "bool", "int", "float")
"""A leaf is an array, a NumPy scalar, a torch tensor, or a Python bool / int / float."""


def leaf_kind(value: Any) -> str:
    """The kind ``encode_samples`` records for one leaf (see ``KINDS``)."""
    if isinstance(value, torch.Tensor):
        return "tensor"
    if isinstance(value, np.ndarray):
        return "ndarray"
    if isinstance(value, np.generic):
        return "numpy"
    for kind, types in (("bool", bool), ("int", int), ("float", float)):  # bool before int: bool is an int
        if isinstance(value, types):
            return kind
    raise TypeError(f"a sample leaf of type {type(value).__name__} cannot be sent; expected {', '.join(KINDS)}")


def encode_samples(samples: Sequence[Mapping[str, Any]], metadata: Optional[Mapping[str, str]] = None) -> bytes:
    """One safetensors buffer of ``samples`` stacked leaf by leaf.

    Args:
        samples: At least one sample; all with the same (nested) keys, leaf kinds, shapes and dtypes.
        metadata: Extra text for the header (``SAMPLES_KEY`` is reserved).

    Returns:
        The encoded bytes.

    Raises:
        ValueError: no samples, or a sample whose keys, kinds or shapes differ from the first's (named).
        TypeError: a leaf the codec cannot carry.
    """
    if not samples:
        raise ValueError("encode_samples needs at least one sample")
    nested = any(isinstance(value, Mapping) for value in samples[0].values())
    flat = [flatten_arrays(sample) for sample in samples] if nested else samples  # the common case: flat samples
    kinds = {name: leaf_kind(value) for name, value in flat[0].items()}
    for index, sample in enumerate(flat[1:], start=1):
        if sample.keys() != kinds.keys():
            diff = sorted(set(sample) ^ set(kinds))
            raise ValueError(f"sample {index} has keys that differ from sample 0's: {diff}")
    stacked = {name: _stack(name, [sample[name] for sample in flat], kind) for name, kind in kinds.items()}
    extra = dict(metadata or {})
    if SAMPLES_KEY in extra:
        raise ValueError(f"metadata key {SAMPLES_KEY!r} is reserved")
    extra[SAMPLES_KEY] = json.dumps({"n": len(samples), "kinds": kinds}, sort_keys=True)
    return encode_arrays(stacked, metadata=extra)


def _stack(name: str, values: List[Any], kind: str) -> np.ndarray:
    kind_of = {t: leaf_kind(v) for t, v in {type(v): v for v in values}.items()}  # one check per type, not per value
    if any(k != kind for k in kind_of.values()):
        index = next(i for i, v in enumerate(values) if kind_of[type(v)] != kind)
        raise ValueError(f"sample {index}: {name!r} is a {leaf_kind(values[index])}, sample 0's a {kind}")
    try:
        if kind == "tensor":
            return torch.stack([v.detach() for v in values]).cpu().numpy()
        if kind == "ndarray":
            return np.stack(values)
        return np.array(values)  # Python or NumPy scalars: one C loop over the list
    except (ValueError, RuntimeError) as e:  # (torch.stack raises RuntimeError on a shape mismatch)
        shapes = sorted({np.shape(v) for v in values})
        raise ValueError(f"{name!r} has different shapes across samples: {shapes}") from e


def decode_samples(data: bytes, max_bytes: int = MAX_BYTES) -> Tuple[List[Dict[str, Any]], Dict[str, str]]:
    """The samples of a buffer made by ``encode_samples``, checked, and the rest of its metadata.

    Args:
        data: The bytes, read from the storage path.
        max_bytes: The largest ``data`` accepted.

    Returns:
        ``(samples, metadata)``: a list of ``N`` sample dicts with the original nesting and leaf types.

    Raises:
        ProtocolError: 400 naming the field for a malformed buffer, missing or inconsistent metadata, an array with
            the wrong number of rows, a non-finite float; 413 over ``max_bytes``.
    """
    arrays, metadata = decode_arrays_and_metadata(data, max_bytes=max_bytes)
    n, kinds = _read_layout(metadata)
    if set(arrays) != set(kinds):
        diff = sorted(set(arrays) ^ set(kinds))
        raise ProtocolError(400, f"arrays and the samples' layout disagree on {diff}", field=diff[0])
    for name, array in arrays.items():
        _check_leaf(name, array, kinds[name], n)
    stored = sum(array.nbytes for array in arrays.values())
    if n > stored:  # else a few bytes could claim 10**12 empty samples and the loop below would never end
        raise ProtocolError(
            400,
            f"{n} samples cannot be held by {stored} bytes of arrays (every sample has at least one byte)",
            field=f"__metadata__.{SAMPLES_KEY}.n",
        )
    columns = {name: _unstack(arrays[name], kind) for name, kind in kinds.items()}
    flat = [dict(zip(columns, row)) for row in zip(*columns.values())]
    rest = {k: v for k, v in metadata.items() if k != SAMPLES_KEY}
    return [unflatten_arrays(sample) for sample in flat], rest


def _read_layout(metadata: Mapping[str, str]) -> Tuple[int, Dict[str, str]]:
    field = f"__metadata__.{SAMPLES_KEY}"
    try:
        layout = json.loads(metadata[SAMPLES_KEY])
    except KeyError:
        raise ProtocolError(400, "not a samples file: its metadata has no samples layout", field=field) from None
    except json.JSONDecodeError as e:
        raise ProtocolError(400, f"the samples layout is not JSON: {e.msg}", field=field) from None
    except RecursionError:
        raise ProtocolError(400, "the samples layout is nested too deeply to be one", field=field) from None
    if not isinstance(layout, dict) or set(layout) != {"n", "kinds"}:
        raise ProtocolError(400, "the samples layout must be {'n': int, 'kinds': {leaf: kind}}", field=field)
    n, kinds = layout["n"], layout["kinds"]
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ProtocolError(400, f"the number of samples must be an int >= 1, got {n!r}", field=f"{field}.n")
    if not isinstance(kinds, dict) or not all(isinstance(k, str) and v in KINDS for k, v in kinds.items()):
        raise ProtocolError(400, f"each leaf's kind must be one of {KINDS}", field=f"{field}.kinds")
    return n, kinds


def _check_leaf(name: str, array: np.ndarray, kind: str, n: int) -> None:
    if array.ndim == 0 or array.shape[0] != n:
        raise ProtocolError(400, f"{name}: expected {n} rows (one per sample), found shape {array.shape}", field=name)
    if kind in ("bool", "int", "float", "numpy") and array.ndim != 1:
        raise ProtocolError(400, f"{name}: a scalar leaf must be one value per sample, found {array.shape}", field=name)
    expected = {"bool": "b", "int": "iu", "float": "f"}.get(kind)
    if expected and array.dtype.kind not in expected:
        raise ProtocolError(400, f"{name}: a {kind} leaf stored as {array.dtype}", field=name)
    if array.dtype.kind == "f" and not np.isfinite(array).all():
        index = tuple(int(i) for i in np.argwhere(~np.isfinite(array))[0])
        raise ProtocolError(400, f"{name}: non-finite value {array[index]} in sample {index[0]}", field=name)


def _unstack(column: np.ndarray, kind: str) -> List[Any]:
    """One leaf's ``N`` values, of its recorded kind (arrays are rows of one fresh, writable copy)."""
    if kind == "ndarray":
        return list(np.array(column))
    if kind == "tensor":
        return list(torch.from_numpy(np.array(column)))
    if kind == "numpy":
        return list(column)  # iterating a 1-D array gives NumPy scalars
    cast = {"bool": bool, "int": int, "float": float}[kind]
    return [cast(value) for value in column.tolist()]
