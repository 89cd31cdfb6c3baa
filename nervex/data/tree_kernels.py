"""Optional compiled kernels for ``SumTree``'s two hot operations (batched search and batched update).

NumPy pays ~0.3 us per call, so a vectorized descent costs ~2 us per tree level however small the batch; a compiled
loop does the same descent in ~0.05 us per sample and level. When ``numba`` can be imported the trees use these
kernels (``backend='numba'``); otherwise, or with ``NERVEX_TREE_BACKEND=numpy`` in the environment, they use the
vectorized NumPy code. Both backends walk the same tree with the same comparisons (results agree up to rounding in
how repeated indices are summed), and the test suite runs both against brute-force references.

The kernels are written for memory, not arithmetic: on a 1M-leaf tree a batch costs mostly cache misses, so the
search goes level by level across the batch (independent loads overlap), its comparisons are branch-free (the
direction is a coin flip), and ``draw`` touches the min-tree lines that the following priority update will write.

``numba`` is not a dependency of nervex; it is picked up when present (it comes with Tianshou, for example).
"""

from __future__ import annotations

import os
from types import SimpleNamespace
from typing import Any, Optional

_KERNELS: Optional[Any] = None
_IMPORT_ERROR: Optional[str] = None


def numba_available() -> bool:
    """Whether the compiled kernels can be used."""
    return _load() is not None


def default_backend() -> str:
    """``'numba'`` when available and not disabled by ``NERVEX_TREE_BACKEND=numpy``, else ``'numpy'``."""
    choice = os.environ.get("NERVEX_TREE_BACKEND", "").strip().lower()
    if choice not in ("", "numpy", "numba"):
        raise ValueError(f"NERVEX_TREE_BACKEND must be 'numpy' or 'numba', got {choice!r}")
    if choice == "numpy":
        return "numpy"
    if choice == "numba" and not numba_available():
        raise ImportError(f"NERVEX_TREE_BACKEND=numba but numba cannot be imported: {_IMPORT_ERROR}")
    return "numba" if numba_available() else "numpy"


def kernels() -> Any:
    """The compiled kernels (``find``, ``update``); raises ``ImportError`` without numba."""
    loaded = _load()
    if loaded is None:
        raise ImportError(f"the numba tree backend needs numba: {_IMPORT_ERROR}")
    return loaded


def _load() -> Optional[Any]:
    global _KERNELS, _IMPORT_ERROR
    if _KERNELS is None and _IMPORT_ERROR is None:
        try:
            _KERNELS = _compile()
        except ImportError as error:
            _IMPORT_ERROR = str(error)
    return _KERNELS


def _compile() -> Any:  # noqa: C901 - the nested kernels count towards the complexity, not branches here
    import numba
    import numpy as np

    jit = numba.njit(nogil=True, cache=True)

    @jit
    def find(flat, offsets, depth, prefix, below_total, values, out):  # pragma: no cover - compiled
        n = values.size
        residual = np.empty(n)
        for i in range(n):
            v = min(values[i], below_total)
            # branch-free binary search for the last j with prefix[j] <= v (prefix[0] = 0 <= v)
            j = 0
            size = prefix.size
            while size > 1:
                half = size >> 1
                j += half * (prefix[j + half] <= v)
                size -= half
            residual[i] = v - prefix[j]
            out[i] = j
        # level by level (not sample by sample): the loads of one level are independent, so their cache misses
        # overlap instead of forming one long chain per sample (several times faster on a 1M-leaf tree)
        for k in range(depth - 1, -1, -1):
            base = offsets[k]
            for i in range(n):
                j = 2 * out[i]
                left = flat[base + j]
                # branch-free: the direction is a coin flip per sample, so a branch would mispredict half the time
                right = residual[i] >= left
                residual[i] -= left * right
                out[i] = j + right

    @jit
    def sum_update(flat, offsets, depth, index, values):  # pragma: no cover - compiled
        # sequential, so a repeated index simply ends with its last value
        for i in range(index.size):
            j = index[i]
            delta = values[i] - flat[j]
            flat[j] = values[i]
            for k in range(1, depth + 1):
                j >>= 1
                flat[offsets[k] + j] += delta

    @jit
    def min_set(flat, offsets, depth, j, value):  # pragma: no cover - compiled
        flat[j] = value
        for k in range(1, depth + 1):
            child = offsets[k - 1] + (j & ~1)
            m = min(flat[child], flat[child + 1])
            j >>= 1
            if flat[offsets[k] + j] == m:
                break  # this node, hence every ancestor, is unchanged
            flat[offsets[k] + j] = m

    @jit
    def min_update(flat, offsets, depth, index, values):  # pragma: no cover - compiled
        for i in range(index.size):
            min_set(flat, offsets, depth, index[i], values[i])

    return SimpleNamespace(find=find, sum_update=sum_update, min_update=min_update)
