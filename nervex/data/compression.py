"""lz4 compression of single arrays, for fields such as Atari frames that the replay buffer keeps compressed.

Only the raw bytes are compressed: the buffer knows every field's dtype and shape from its schema, so nothing about
the array is stored with it and decompression needs no unpickling.
"""

from __future__ import annotations

from typing import Tuple

import lz4.block
import numpy as np


def compress_array(array: np.ndarray) -> bytes:
    """lz4 (block format, fast mode) of the array's bytes in C order."""
    return lz4.block.compress(np.ascontiguousarray(array), store_size=False)


def decompress_array(data: bytes, dtype: np.dtype, shape: Tuple[int, ...], out: np.ndarray | None = None) -> np.ndarray:
    """Inverse of ``compress_array``.

    Args:
        data: What ``compress_array`` returned.
        dtype: The array's dtype.
        shape: The array's shape.
        out: Optional array to write into (of that shape, or one that shape broadcasts to).

    Returns:
        The array (``out`` when given).
    """
    nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    raw = lz4.block.decompress(data, uncompressed_size=nbytes)
    array = np.frombuffer(raw, dtype=dtype).reshape(shape)
    if out is None:
        return array.copy()
    np.copyto(out, array)
    return out
