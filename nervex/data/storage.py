"""Columnar sample storage: one preallocated NumPy array per field, created from the first sample's structure.

A sample is a (possibly nested) dict whose leaves are numbers or arrays. Each leaf becomes a *column* of shape
``(maxlen, *leaf_shape)``. Storing a sample writes one row of every column; sampling a batch gathers rows with one
``np.take`` per column. Fields named in ``compress_fields`` are kept as lz4-compressed bytes, one object per row.

Type rules (shared with ``TrajectoryWriter`` and ``collate``): Python ``float`` -> ``float32``, ``int`` -> ``int64``,
``bool`` -> ``bool``, ``float64`` arrays -> ``float32``; every other numeric dtype is kept (``uint8`` frames stay
``uint8``). Torch tensors are accepted and stored as their NumPy equivalent.

Small uncompressed columns (rows of at most ``PACK_ROW_BYTES`` bytes, e.g. a 4-float observation, the action, the
reward and the flags) share one row-major block (``packing.pack_records``): each column's ``data`` is a strided view
into it, so the fields of one sample sit in one or two cache lines. Sampling draws random rows, and on a large buffer each field of a row would
otherwise be its own cache miss (six misses per transition instead of one for a CartPole transition).
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch

from .compression import compress_array, decompress_array
from .packing import PackedPlan, pack_records
from .pool import ArrayPool

Path = Tuple[str, ...]
RESERVED_FIELDS = ("weight", "index", "unique_id")
_SCALAR_TYPES = (float, int, bool)


def to_array(value: Any, name: str = "value") -> np.ndarray:
    """Convert a sample leaf to a NumPy array under the storage type rules.

    Raises:
        ValueError: ``value`` is ``None``, a string or anything else without a numeric dtype.
    """
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().numpy()
    if value is None:
        raise ValueError(f"field '{name}' is None; store numbers or numeric arrays only (drop the field instead)")
    array = np.asarray(value)
    if array.dtype == np.float64:
        array = array.astype(np.float32)
    if array.dtype.kind not in "biufc":
        raise ValueError(
            f"field '{name}' holds {type(value).__name__} with dtype {array.dtype}; "
            "only numbers and numeric arrays can be stored"
        )
    return array


def flatten(sample: Mapping[str, Any], prefix: Path = ()) -> List[Tuple[Path, Any]]:
    """``(path, leaf)`` pairs of a nested dict, depth first in key order."""
    if not isinstance(sample, Mapping):
        raise ValueError(f"a sample must be a dict of arrays and numbers, got {type(sample).__name__}")
    items: List[Tuple[Path, Any]] = []
    for key, value in sample.items():
        path = prefix + (str(key),)
        if isinstance(value, Mapping):
            if not value:
                raise ValueError(f"field '{'.'.join(path)}' is an empty dict; drop it before storing the sample")
            items.extend(flatten(value, path))
        else:
            items.append((path, value))
    return items


def unflatten(paths: Sequence[Path], values: Sequence[Any]) -> Dict[str, Any]:
    """Inverse of ``flatten``: a nested dict from paths and leaves."""
    out: Dict[str, Any] = {}
    for path, value in zip(paths, values):
        node = out
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = value
    return out


def get_path(sample: Mapping[str, Any], path: Path) -> Any:
    for key in path:
        sample = sample[key]
    return sample


class Column:
    """One leaf field: its path, dtype, per-sample shape and the preallocated rows."""

    def __init__(
        self,
        path: Path,
        dtype: np.dtype,
        shape: Tuple[int, ...],
        maxlen: int,
        compressed: bool,
        data: Optional[np.ndarray] = None,
    ) -> None:
        self.path = path
        self.name = ".".join(path)
        self.key = path[0] if len(path) == 1 else None
        self.dtype = np.dtype(dtype)
        self.shape = tuple(int(s) for s in shape)
        self.compressed = compressed
        self.packed = data is not None
        self.row_nbytes = int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize
        if compressed:
            self.data = np.empty(maxlen, dtype=object)
            self.sizes = np.zeros(maxlen, dtype=np.int64)
        elif data is not None:
            self.data = data  # a view into the packed block of small columns (see packing.pack_records)
        else:
            # np.zeros maps untouched pages lazily, so a large, mostly empty buffer costs little memory
            self.data = np.zeros((maxlen, *self.shape), dtype=self.dtype)

    def describe(self) -> Dict[str, Any]:
        return {
            "path": list(self.path),
            "dtype": self.dtype.str,
            "shape": list(self.shape),
            "compressed": self.compressed,
        }

    def shape_error(self, shape: Tuple[int, ...], where: str = "") -> ValueError:
        return ValueError(
            f"field '{self.name}'{where} has shape {tuple(shape)}, but the first sample stored had shape {self.shape}; "
            "every sample must have the same fields and shapes"
        )


class ColumnStorage:
    """Preallocated columns for ``maxlen`` samples.

    Args:
        maxlen: Number of rows.
        compress_fields: Dotted field names (``'obs'``, ``'obs.image'``) to keep lz4-compressed; naming a dict
            compresses every leaf under it.
    """

    def __init__(self, maxlen: int, compress_fields: Sequence[str] = ()) -> None:
        self.maxlen = int(maxlen)
        self.compress_fields = tuple(compress_fields)
        self.columns: List[Column] = []
        self._keytree: Optional[Dict[str, Any]] = None
        self._flat = True
        self._any_compressed = False
        self._records: Optional[np.ndarray] = None  # the packed small columns, structured, shape (maxlen,)
        self._packed_fields: List[Optional[str]] = []  # field of each column in _records (None: stored apart)
        self._plan: Optional[PackedPlan] = None  # how a tree draw copies the packed columns (see packed_plan)
        self._direct: Optional[List[Tuple[str, Tuple[int, ...], np.dtype, int]]] = None  # see tensors_from_block
        self._pool = ArrayPool()  # output arrays of large columns, reused once released

    @property
    def ready(self) -> bool:
        """Whether the schema exists (a first sample was seen)."""
        return self._keytree is not None

    @property
    def field_names(self) -> List[str]:
        return [c.name for c in self.columns]

    def clear(self) -> None:
        """Forget the schema and free the columns."""
        self.columns, self._keytree, self._flat, self._any_compressed = [], None, True, False
        self._records, self._packed_fields, self._plan, self._direct = None, [], None, None
        self._pool.clear()

    # ---- schema ----------------------------------------------------------------------------------------------
    def init_schema(self, sample: Mapping[str, Any], batched: bool = False) -> None:
        """Create the columns from a sample (or, with ``batched``, from a dict of arrays with a leading batch dim)."""
        specs = []
        for path, value in flatten(sample):
            name = ".".join(path)
            if path[0] in RESERVED_FIELDS and len(path) == 1:
                raise ValueError(f"field '{name}' is reserved for the sampled batch ({', '.join(RESERVED_FIELDS)})")
            array = to_array(value, name)
            if batched:
                if array.ndim == 0:
                    raise ValueError(f"field '{name}' of a batch must have a leading batch dimension, got a scalar")
                array = array[0]
            specs.append((path, array.dtype, array.shape))
        self._set_schema(specs)

    def schema(self) -> List[Dict[str, Any]]:
        """JSON-ready description of the columns (for save files)."""
        return [c.describe() for c in self.columns]

    def init_from_description(self, description: Sequence[Mapping[str, Any]]) -> None:
        specs = [(tuple(d["path"]), np.dtype(d["dtype"]), tuple(d["shape"])) for d in description]
        self._set_schema(specs)
        saved = {".".join(d["path"]): bool(d["compressed"]) for d in description}
        for col in self.columns:
            if col.compressed != saved[col.name]:
                state = "compressed" if saved[col.name] else "not compressed"
                raise ValueError(f"field '{col.name}' was saved {state}; set compress_fields to match the saved buffer")

    def _set_schema(self, specs: Sequence[Tuple[Path, np.dtype, Tuple[int, ...]]]) -> None:
        names = {".".join(p) for p, _, _ in specs}
        for field in self.compress_fields:
            if not any(n == field or n.startswith(field + ".") for n in names):
                raise ValueError(
                    f"compress_fields names '{field}', which is not a field of the samples "
                    f"(fields: {', '.join(sorted(names))})"
                )
        views, self._records, packed_bytes = pack_records(
            [(np.dtype(d), tuple(int(x) for x in s)) for p, d, s in specs],
            [self._is_compressed(p) for p, _, _ in specs],
            self.maxlen,
        )
        self.columns = [
            Column(p, d, s, self.maxlen, self._is_compressed(p), view) for (p, d, s), view in zip(specs, views)
        ]
        keytree: Dict[str, Any] = {}
        for path, _, _ in specs:
            node = keytree
            for key in path[:-1]:
                node = node.setdefault(key, {})
            node[path[-1]] = None
        self._keytree = keytree
        self._flat = all(len(p) == 1 for p, _, _ in specs)
        self._any_compressed = any(c.compressed for c in self.columns)
        self._packed_fields = [f"f{i}" if c.packed else None for i, c in enumerate(self.columns)]
        self._plan = None
        self._direct: Optional[List[Tuple[str, Tuple[int, ...], np.dtype, int]]] = None
        if self._records is not None:
            self._plan = PackedPlan(
                self._records, packed_bytes, [c.row_nbytes for c in self.columns], self._packed_fields
            )
            if self._flat and all(offset >= 0 for offset in self._plan.offsets):
                self._direct = [(c.key, c.shape, c.dtype, o) for c, o in zip(self.columns, self._plan.offsets)]

    @property
    def direct(self) -> bool:
        """Whether every column is packed (flat names, no compression): ``tensors_from_block`` makes the batch."""
        return self._direct is not None

    def tensors_from_block(self, n: int, block: np.ndarray) -> Dict[str, Any]:
        """The batch's dict of tensors, each a view of the block a tree draw filled (see ``PackedPlan``)."""
        return {
            key: torch.from_numpy(np.ndarray((n, *shape), dtype, block, n * offset))
            for key, shape, dtype, offset in self._direct
        }

    @property
    def packed_plan(self) -> Optional[PackedPlan]:
        """How a tree draw copies the packed columns of a batch into one field-major block (None when nothing
        is packed); it hands the block to ``gather(index, block)``."""
        return self._plan

    def _is_compressed(self, path: Path) -> bool:
        name = ".".join(path)
        return any(name == f or name.startswith(f + ".") for f in self.compress_fields)

    def check_keys(self, sample: Mapping[str, Any], tree: Optional[Mapping[str, Any]] = None, prefix: str = "") -> None:
        """Raise ``ValueError`` naming the fields that differ from the schema."""
        tree = self._keytree if tree is None else tree
        if not isinstance(sample, Mapping):
            raise ValueError(f"field '{prefix.rstrip('.') or 'sample'}' must be a dict, got {type(sample).__name__}")
        if sample.keys() != tree.keys():
            missing = sorted(prefix + k for k in tree.keys() - sample.keys())
            extra = sorted(prefix + str(k) for k in sample.keys() - tree.keys())
            raise ValueError(
                f"sample fields differ from the first sample stored: missing {missing}, unexpected {extra}; "
                "every sample must have the same fields"
            )
        if not self._flat:
            for key, sub in tree.items():
                if sub is not None:
                    self.check_keys(sample[key], sub, f"{prefix}{key}.")

    # ---- converting samples to rows --------------------------------------------------------------------------
    def convert_one(self, sample: Mapping[str, Any]) -> List[Any]:
        """Validate one sample and return one row value per column (compressed ones as bytes)."""
        self.check_keys(sample)
        row = []
        for col in self.columns:
            value = sample[col.key] if col.key is not None else get_path(sample, col.path)
            kind = type(value)
            if kind is np.ndarray:
                shape = value.shape
                if value.dtype.kind not in "biufc":
                    to_array(value, col.name)  # raises with the field's name
            elif kind in _SCALAR_TYPES:
                shape = ()
            else:
                value = to_array(value, col.name)
                shape = value.shape
            if shape != col.shape:
                raise col.shape_error(shape)
            if col.compressed:
                value = compress_array(np.asarray(value, dtype=col.dtype))
            row.append(value)
        return row

    def convert_many(self, samples: Sequence[Mapping[str, Any]]) -> List[Any]:
        """Validate a list of samples and return one stacked array (or list of bytes) per column."""
        for sample in samples:
            self.check_keys(sample)
        out = []
        for col in self.columns:
            values = [sample[col.key] if col.key is not None else get_path(sample, col.path) for sample in samples]
            try:
                stacked = np.asarray(values) if not isinstance(values[0], torch.Tensor) else torch.stack(values).numpy()
            except (ValueError, RuntimeError):
                stacked = None  # ragged shapes: find the culprit below for a precise message
            if stacked is None or stacked.shape[1:] != col.shape:
                for i, value in enumerate(values):
                    shape = to_array(value, col.name).shape
                    if shape != col.shape:
                        raise col.shape_error(shape, f" of sample {i}") from None
            if stacked.dtype.kind not in "biufc":
                for value in values:  # the first non-numeric value raises with the field's name
                    to_array(value, col.name)
                to_array(stacked, col.name)
            out.append(self._compress_rows(col, stacked) if col.compressed else stacked)
        return out

    def convert_batch(self, batch: Mapping[str, Any]) -> Tuple[List[Any], int]:
        """Validate a dict of batched arrays; return one array (or list of bytes) per column and the batch size."""
        self.check_keys(batch)
        out, n = [], None
        for col in self.columns:
            value = batch[col.key] if col.key is not None else get_path(batch, col.path)
            if type(value) is not np.ndarray:
                value = to_array(value, col.name)
            if value.ndim == 0 or value.shape[1:] != col.shape:
                raise col.shape_error(value.shape[1:] if value.ndim else (), " (per sample, batch dim removed)")
            if n is None:
                n = value.shape[0]
            elif value.shape[0] != n:
                raise ValueError(f"field '{col.name}' has {value.shape[0]} rows but '{self.columns[0].name}' has {n}")
            out.append(self._compress_rows(col, value) if col.compressed else value)
        return out, int(n or 0)

    @staticmethod
    def _compress_rows(col: Column, rows: np.ndarray) -> List[bytes]:
        rows = np.asarray(rows, dtype=col.dtype)
        return [compress_array(r) for r in rows]

    # ---- writing and reading rows ----------------------------------------------------------------------------
    def write_one(self, slot: int, row: Sequence[Any]) -> None:
        for col, value in zip(self.columns, row):
            if col.compressed:
                col.data[slot] = value
                col.sizes[slot] = len(value)
            else:
                col.data[slot] = value

    def write_rows(self, slot: int, values: Sequence[Any], lo: int, hi: int) -> None:
        """Write rows ``lo:hi`` of every converted column into ``slot:slot + hi - lo``."""
        end = slot + hi - lo
        for col, value in zip(self.columns, values):
            if col.compressed:
                blobs = value[lo:hi]
                col.data[slot:end] = blobs
                col.sizes[slot:end] = [len(b) for b in blobs]
            else:
                col.data[slot:end] = value[lo:hi]

    def gather(self, index: np.ndarray, block: Optional[np.ndarray] = None) -> List[np.ndarray]:
        """Rows ``index`` of every column, as new arrays; compressed columns as an object array of their bytes.

        Call ``to_tensors`` on the result (it decompresses); the two are split so that a caller holding a lock only
        needs it for the copy, not for the decompression.

        Args:
            index: Slots to read.
            block: The packed columns of those slots, already copied field-major by a tree draw (see
                ``PackedPlan``); the packed columns are then views into it. None: copied here.
        """
        if self._records is None:
            return [self._take(col, index) for col in self.columns]
        if block is not None:
            n = index.size
            return [
                self._take(col, index) if offset < 0 else np.ndarray((n, *col.shape), col.dtype, block, n * offset)
                for col, offset in zip(self.columns, self._plan.offsets)
            ]
        # one take of whole records (one cache miss per sample), then per-field copies from the cache-hot records;
        # np.take on a strided column would instead copy the whole column first
        records = self._records.take(index)
        return [
            self._take(col, index) if field is None else records[field].copy()
            for col, field in zip(self.columns, self._packed_fields)
        ]

    def _take(self, col: Column, index: np.ndarray) -> np.ndarray:
        if col.compressed:
            return col.data.take(index)  # the blobs (an object array); to_tensors decompresses them
        # large rows (frames) go into pooled arrays: see pool.py for the page faults this avoids
        return col.data.take(index, axis=0, out=self._pool.empty((index.size, *col.shape), col.dtype))

    def to_tensors(self, arrays: Sequence[np.ndarray]) -> Dict[str, Any]:
        """Gathered rows -> the sample's nested dict of tensors (decompressing compressed columns)."""
        if self._any_compressed:
            arrays = [self._decompress_rows(c, a) if c.compressed else a for c, a in zip(self.columns, arrays)]
        if self._flat:
            return {col.key: torch.from_numpy(a) for col, a in zip(self.columns, arrays)}
        return unflatten([c.path for c in self.columns], [torch.from_numpy(a) for a in arrays])

    def _decompress_rows(self, col: Column, blobs: np.ndarray) -> np.ndarray:
        rows = self._pool.empty((blobs.size, *col.shape), col.dtype)
        for i, blob in enumerate(blobs):
            decompress_array(blob, col.dtype, col.shape, out=rows[i : i + 1])  # a view even for scalar fields
        return rows

    # ---- memory and persistence ------------------------------------------------------------------------------
    def memory(self, filled: int) -> Dict[str, float]:
        """Bytes held for ``filled`` rows: ``stored`` (as kept) and ``raw`` (as they would be uncompressed)."""
        stored = raw = 0
        for col in self.columns:
            raw += col.row_nbytes * filled
            if col.compressed:
                # payload + the bytes object header (~33 B) + the object array's pointer
                stored += int(col.sizes[:filled].sum()) + 41 * filled
            else:
                stored += col.row_nbytes * filled
        return {"stored": float(stored), "raw": float(raw)}

    def compression_ratio(self, filled: int) -> float:
        """Raw / stored bytes over the compressed columns (1.0 when none)."""
        raw = sum(c.row_nbytes * filled for c in self.columns if c.compressed)
        stored = sum(int(c.sizes[:filled].sum()) for c in self.columns if c.compressed)
        return float(raw / stored) if stored else 1.0

    def state_arrays(self, filled: int) -> Dict[str, np.ndarray]:
        """Rows ``0:filled`` as plain arrays (compressed columns as one byte blob plus sizes): no pickling needed."""
        arrays = {}
        for i, col in enumerate(self.columns):
            if col.compressed:
                blob = b"".join(col.data[:filled].tolist())
                arrays[f"col{i}_blob"] = np.frombuffer(blob, dtype=np.uint8)
                arrays[f"col{i}_sizes"] = col.sizes[:filled].copy()
            else:
                arrays[f"col{i}"] = col.data[:filled]
        return arrays

    def load_state_arrays(self, arrays: Mapping[str, np.ndarray], filled: int) -> None:
        for i, col in enumerate(self.columns):
            if col.compressed:
                sizes = arrays[f"col{i}_sizes"]
                blob = arrays[f"col{i}_blob"].tobytes()
                ends = np.cumsum(sizes)
                col.data[:filled] = [blob[e - s : e] for s, e in zip(sizes.tolist(), ends.tolist())]
                col.sizes[:filled] = sizes
            else:
                col.data[:filled] = arrays[f"col{i}"]
