"""The row-major block that small columns of a ``ColumnStorage`` share, and how a tree draw copies it.

Sampling draws random rows; on a large buffer each field of a row stored in its own column would be its own cache miss
(six misses per transition instead of one for a CartPole transition). So the small uncompressed columns (rows of at
most ``PACK_ROW_BYTES`` bytes) are laid out as records of one block: ``pack_records`` builds it, each column's data is a
strided view into it, and ``PackedPlan`` tells ``PriorityTree.draw`` how to copy the drawn records field by field.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

PACK_ROW_BYTES = 64  # columns with rows up to this size share the row-major block (one cache line per field at most)
PACK_MAX_RECORD = 256  # past this, a record spans so many lines that packing more columns gains nothing

Spec = Tuple[np.dtype, Tuple[int, ...]]


def pack_records(
    specs: Sequence[Spec], compressed: Sequence[bool], maxlen: int
) -> Tuple[List[Optional[np.ndarray]], Optional[np.ndarray], Optional[np.ndarray]]:
    """One row-major block for the small uncompressed columns: a strided view per packed column, and the block.

    Fields are laid out largest alignment first, so every field sits at an offset that is a multiple of its item
    size, and the record is padded to the largest item size (to a power of two up to ``PACK_ROW_BYTES``): each view is
    aligned and converts to a torch tensor.

    Args:
        specs: Per column, its dtype and row shape.
        compressed: Per column, whether it is stored compressed (never packed).
        maxlen: Rows of the block.

    Returns:
        A view per column (None for a column stored on its own), the block as a 1-D structured array whose field
        ``f{i}`` is column ``i``, and its bytes rounded up to whole 8-byte words (both None when fewer than two
        columns are packed).

    Shapes:
        a packed column of row shape ``s``: ``(maxlen, *s)``; the block: ``(maxlen,)``.
    """
    views: List[Optional[np.ndarray]] = [None] * len(specs)
    offsets, used = _field_offsets(specs, compressed)
    if len(offsets) < 2:
        return views, None, None  # a single column is already row-major on its own
    record = _record_size(used, max(specs[i][0].alignment for i in offsets))
    block, words = _aligned_block(maxlen * record)
    order = sorted(offsets)
    records = block.view(
        np.dtype(
            {
                "names": [f"f{i}" for i in order],
                "formats": [(specs[i][0], specs[i][1]) if specs[i][1] else specs[i][0] for i in order],
                "offsets": [offsets[i] for i in order],
                "itemsize": record,
            }
        )
    )
    for i in order:
        views[i] = records[f"f{i}"]
    return views, records, words


def _field_offsets(specs: Sequence[Spec], compressed: Sequence[bool]) -> Tuple[Dict[int, int], int]:
    """Each packed column's byte offset in a record, largest alignment first, and the bytes they use."""
    small = [
        i
        for i, (dtype, shape) in enumerate(specs)
        if not compressed[i] and 0 < _row_nbytes(dtype, shape) <= PACK_ROW_BYTES
    ]
    small.sort(key=lambda i: -specs[i][0].alignment)  # stable: equal alignments keep the schema order
    offsets: Dict[int, int] = {}
    used = 0
    for i in small:
        nbytes = _row_nbytes(*specs[i])
        if used + nbytes > PACK_MAX_RECORD:
            break
        offsets[i], used = used, used + nbytes
    return offsets, used


def _record_size(used: int, align: int) -> int:
    """The record's size: ``used`` bytes padded to a power of two (up to ``PACK_ROW_BYTES``), else to ``align``."""
    if used <= PACK_ROW_BYTES:
        # a power of two divides the cache line, so no record straddles two lines (the block is line-aligned)
        return max(align, 1 << (used - 1).bit_length())
    return -(-used // align) * align


def _aligned_block(nbytes: int) -> Tuple[np.ndarray, np.ndarray]:
    """``nbytes`` zeroed bytes starting on a cache line, and the same bytes rounded up to whole 8-byte words."""
    # np.zeros maps untouched pages lazily, as for a column of its own; the slack aligns the block to a cache line
    raw = np.zeros(nbytes + PACK_ROW_BYTES + 8, dtype=np.uint8)
    start = -raw.ctypes.data % PACK_ROW_BYTES
    return raw[start : start + nbytes], raw[start : start + -(-nbytes // 8) * 8]


def _row_nbytes(dtype: np.dtype, shape: Tuple[int, ...]) -> int:
    return int(np.prod(shape, dtype=np.int64)) * dtype.itemsize


class PackedPlan:
    """The packed small columns, as ``PriorityTree.draw`` copies them: for a batch of ``n`` samples, field ``f`` (at
    byte ``o`` of a record) goes to bytes ``[n * o, n * o + n * size)`` of one block of ``n * record`` bytes, i.e. each
    field is contiguous there and becomes an array (then a tensor) without another copy.

    Args:
        records: The block as a structured array (``pack_records``).
        source: The block's bytes, rounded up to whole 8-byte words (``pack_records``).
        row_nbytes: Per column, the bytes of one row.
        fields: Per column, its field name in ``records`` (None: not packed).

    Attributes:
        source: The packed block as ``uint8``, its length a multiple of 8 (so the kernel can view it as words).
        record: Bytes per record.
        table: ``int64 (F, 4)``, one row per packed field: copy width in bytes (8, 4, 2 or 1; it divides the field's
            offset, size and the record), offset and size in units of that width, offset in bytes.
        offsets: Per column, its byte offset in a record (-1: not packed).
    """

    def __init__(
        self, records: np.ndarray, source: np.ndarray, row_nbytes: Sequence[int], fields: Sequence[Optional[str]]
    ) -> None:
        self.record = records.dtype.itemsize
        self.source = source
        self.offsets = [-1 if f is None else records.dtype.fields[f][1] for f in fields]
        rows = []
        for nbytes, offset in zip(row_nbytes, self.offsets):
            if offset >= 0:
                width = next(w for w in (8, 4, 2, 1) if not (offset % w or nbytes % w or self.record % w))
                rows.append((width, offset // width, nbytes // width, offset))
        self.table = np.asarray(rows, dtype=np.int64).reshape(-1, 4)

    def block(self, n: int) -> np.ndarray:
        """A new block for ``n`` samples (``uint8``, its length a multiple of 8)."""
        return np.empty(-(-n * self.record // 8) * 8, dtype=np.uint8)


__all__ = ["PACK_MAX_RECORD", "PACK_ROW_BYTES", "PackedPlan", "pack_records"]
