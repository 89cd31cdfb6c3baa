"""``PriorityTree``: the replay buffer's sum tree (sampling) and min tree (importance weights) over slot priorities.

Why 8-ary: at 1M leaves a binary descent touches ~20 levels and nearly every level is a cache miss. Here the 8
children of a node are contiguous ``float64`` (one 64-byte line), so a descent touches ~7 lines for 1M leaves and
scans each one, and an update reads the same ~7 lines to refresh the ancestors.

Layout: all levels live in one flat array, top level first, leaves last (so the leaves are a contiguous view). Level
``k`` counts up from the leaves (``0``) to the top (``depth``); node ``j`` of level ``k + 1`` has children
``8 j .. 8 j + 7`` of level ``k``. The top level has at most 8 nodes, padded to 8 with neutral values.

Exactness: an update adds the change of each leaf to each ancestor, and the sums are rebuilt exactly every
``capacity`` updates to remove the drift. The min tree is always exact: the importance weights are normalized by the
minimum priority.

Backends: ``numba_kernels`` (compiled) when numba imports, else ``numpy_kernels``: the same functions with the same
floating-point operations, so the trees and draws of both are identical (up to the last bit of ``pow`` where NumPy
vectorizes it itself; see ``numpy_kernels``). ``NERVEX_TREE_BACKEND=numpy`` forces NumPy.
"""

from __future__ import annotations

import os
import warnings
from types import ModuleType
from typing import Any, List, Optional, Tuple

import numpy as np

from . import numpy_kernels

A = numpy_kernels.A
_COMPILED: Optional[ModuleType] = None
_COMPILE_ERROR: Optional[str] = None


def numba_available() -> bool:
    """Whether the compiled kernels can be used (numba imports and can cache its machine code)."""
    global _COMPILED, _COMPILE_ERROR
    if _COMPILED is None and _COMPILE_ERROR is None:
        try:
            from . import numba_kernels

            _COMPILED = numba_kernels
        except ImportError as error:
            _COMPILE_ERROR = str(error)
        except RuntimeError as error:
            # numba found no writable place for its cache (a read-only install and no usable home directory):
            # say so once and use NumPy rather than fail; NUMBA_CACHE_DIR=/some/writable/dir restores the kernels
            _COMPILE_ERROR = f"numba could not set up its kernel cache ({error}); set NUMBA_CACHE_DIR"
            warnings.warn(f"nervex replay trees fall back to NumPy: {_COMPILE_ERROR}", RuntimeWarning, stacklevel=2)
    return _COMPILED is not None


def default_backend() -> str:
    """``'numba'`` when available and not disabled by ``NERVEX_TREE_BACKEND=numpy``, else ``'numpy'``.

    Raises:
        ValueError: ``NERVEX_TREE_BACKEND`` is set to something else than ``numpy`` or ``numba``.
        ImportError: ``NERVEX_TREE_BACKEND=numba`` but numba cannot be used.
    """
    choice = os.environ.get("NERVEX_TREE_BACKEND", "").strip().lower()
    if choice not in ("", "numpy", "numba"):
        raise ValueError(f"NERVEX_TREE_BACKEND must be 'numpy' or 'numba', got {choice!r}")
    if choice == "numpy":
        return "numpy"
    if choice == "numba" and not numba_available():
        raise ImportError(f"NERVEX_TREE_BACKEND=numba but numba cannot be used: {_COMPILE_ERROR}")
    return "numba" if numba_available() else "numpy"


class _NoCopy:
    """The copy plan of a draw that copies no columns (see ``packing.PackedPlan``)."""

    source = np.zeros(8, dtype=np.uint8)
    record = 8
    table = np.zeros((0, 4), dtype=np.int64)

    @staticmethod
    def block(n: int) -> np.ndarray:
        return _NoCopy.source


class PriorityTree:
    """Sums of leaves ``priority ** alpha`` and minima of priorities over ``capacity`` slots, with stratified draws.

    An empty slot has leaf 0 and priority ``inf``. Writes of new samples (``fill``) are propagated lazily, before the
    next read, so that storing one sample at a time stays cheap.

    Args:
        capacity: Number of slots; the tree rounds it up to a power of two (at least 8).
        alpha: Priority exponent of the leaves (float32 ``pow``, as the kernels compute it).
        seed: Seed of the draws' generator (splitmix64, the same stream on both backends).
        backend: ``'numba'``, ``'numpy'`` or None for ``default_backend()``.

    Examples:
        >>> tree = PriorityTree(16, alpha=1.0, backend="numpy")
        >>> tree.fill(0, 3, 2.0)
        >>> tree.update(np.array([1]), np.array([4.0]), slot_uid=np.arange(16), first_uid=0, eps=1e-6)
        (0, 4.0)
        >>> tree.total(), tree.min(), tree.find(np.array([1.0, 2.0, 6.5])).tolist()
        (8.0, 2.0, [0, 1, 2])
    """

    def __init__(self, capacity: int, alpha: float = 1.0, seed: int = 0, backend: Optional[str] = None) -> None:
        if capacity < 1:
            raise ValueError(f"PriorityTree capacity must be >= 1, got {capacity}")
        self.backend = backend or default_backend()
        if self.backend not in ("numpy", "numba"):
            raise ValueError(f"PriorityTree backend must be 'numpy' or 'numba', got {self.backend!r}")
        if self.backend == "numba" and not numba_available():
            raise ImportError(f"the numba PriorityTree backend cannot be used: {_COMPILE_ERROR}")
        self._k: Any = _COMPILED if self.backend == "numba" else numpy_kernels
        self.alpha = float(alpha)
        self.capacity = max(A, 1 << (int(capacity) - 1).bit_length())
        sizes = [self.capacity]
        while sizes[-1] > A:
            sizes.append(sizes[-1] // A)
        self.depth = len(sizes) - 1
        stored = sizes[:-1] + [A]  # the top level padded to a whole group of siblings
        starts = np.concatenate(([0], np.cumsum(stored[::-1])[:-1]))[::-1]
        self._offsets = np.ascontiguousarray(starts, dtype=np.int64)
        self._sizes = np.asarray(sizes, dtype=np.int64)
        self._sum = _aligned(int(sum(stored)))
        self._min = _aligned(int(sum(stored)))
        self._leaves = self._sum[self._offsets[0] :][: self.capacity]
        self._priorities = self._min[self._offsets[0] :][: self.capacity]
        self._rng = np.array([seed], dtype=np.uint64)
        self._dirty: List[List[int]] = []  # [start, stop) ranges written by fill and not yet propagated
        self._fill_leaf = (1.0, self._leaf(1.0))  # (priority, its leaf) of the last fill, cached
        self.clear()

    @property
    def leaves(self) -> np.ndarray:
        """The sum tree's leaves, ``leaf(priority)`` or 0 for an empty slot (read-only view)."""
        view = self._leaves.view()
        view.flags.writeable = False
        return view

    @property
    def priorities(self) -> np.ndarray:
        """The slots' priorities, ``inf`` for an empty slot (read-only view)."""
        view = self._priorities.view()
        view.flags.writeable = False
        return view

    def _leaf(self, priority: float) -> float:
        return float(self._k.leaf_values(np.array([priority], dtype=np.float64), self.alpha)[0])

    def clear(self) -> None:
        """Empty every slot."""
        self._sum.fill(0.0)
        self._min.fill(np.inf)
        self._dirty.clear()
        self._updates_since_rebuild = 0

    def total(self) -> float:
        """Sum of the leaves (the running sum over the top level, in the order a search adds them)."""
        self._flush()
        top = self._offsets[self.depth]
        return float(np.cumsum(self._sum[top : top + self._sizes[self.depth]])[-1])

    def min(self) -> float:
        """The smallest priority (``inf`` when every slot is empty)."""
        self._flush()
        top = self._offsets[self.depth]
        return float(self._min[top : top + A].min())

    def fill(self, start: int, stop: int, priority: Any) -> None:
        """Set slots ``[start, stop)`` to ``priority`` (a number, or one per slot with ``inf`` for empty ones).

        Shapes:
            priority: scalar or ``(stop - start,)``.
        """
        if not 0 <= start <= stop <= self.capacity:
            raise ValueError(f"fill range [{start}, {stop}) is outside the tree's slots [0, {self.capacity})")
        if isinstance(priority, (float, int)):
            if self._fill_leaf[0] != priority:
                self._fill_leaf = (priority, self._leaf(priority))
            if stop == start + 1:  # one sample stored (the common case): an element is cheaper to set than a slice
                self._leaves[start], self._priorities[start] = self._fill_leaf[1], priority
            else:
                self._leaves[start:stop], self._priorities[start:stop] = self._fill_leaf[1], priority
        else:
            priority = np.asarray(priority, dtype=np.float64)
            self._leaves[start:stop] = np.where(priority < np.inf, self._k.leaf_values(priority, self.alpha), 0.0)
            self._priorities[start:stop] = priority
        dirty = self._dirty
        if dirty and dirty[-1][1] == start:
            dirty[-1][1] = stop
        elif len(dirty) < 4:
            dirty.append([start, stop])
        else:  # a writer that wraps the ring repeatedly between two reads: one full refresh is cheaper
            dirty[:] = [[0, self.capacity]]

    def update(
        self, uid: np.ndarray, priority: np.ndarray, slot_uid: np.ndarray, first_uid: int, eps: float
    ) -> Tuple[int, float]:
        """Set the priorities of samples by unique id; those no longer in their slot are skipped.

        Args:
            uid: Unique ids (``int64``) of samples drawn earlier. The sample ``u`` lives in slot
                ``(u - first_uid) % slot_uid.size`` (a ring) as long as ``slot_uid`` there still says ``u``; a
                repeated sample keeps its last priority.
            priority: New priorities (``float64``), floored at ``eps``.
            slot_uid: The unique id each slot holds now (-1: none).
            first_uid: The unique id of the sample that went to slot 0.
            eps: Priority floor (> 0).

        Returns:
            The number of updates skipped (the sample was overwritten or evicted since), and the largest priority set
            (0 if none).

        Raises:
            ValueError: A priority is negative, NaN or infinite (the message gives it and its position).

        Shapes:
            uid, priority: ``(n,)``; slot_uid: ``(slots,)`` with ``slots <= capacity``.
        """
        if self._dirty:
            self._flush()
        status, info, p_max = self._k.update_priorities(
            uid, priority, first_uid, slot_uid, eps, self.alpha, self._sum, self._min, self._offsets, self.depth
        )
        if status < 0:
            raise ValueError(f"priorities must be finite and >= 0, got {priority[info]} at position {info}")
        self._count_updates(uid.size - info)
        return int(info), float(p_max)

    def remove(self, index: np.ndarray) -> None:
        """Empty slots ``index`` (``int64``, no repeats needed)."""
        self._flush()
        zeros = np.zeros(index.size)
        self._k.update(self._sum, self._min, self._offsets, self.depth, index, zeros, np.full(index.size, np.inf))
        self._count_updates(index.size)

    def find(self, value: np.ndarray) -> np.ndarray:
        """For each ``v``, the slot ``i`` with ``sum(leaves[:i]) <= v < sum(leaves[:i + 1])``.

        Args:
            value: Prefix sums in ``[0, total())``; values at or above the total are clipped just below it.

        Returns:
            Slots, ``int64``. Rounding at a boundary can return an empty slot; ``draw`` redraws those.

        Raises:
            ValueError: Every slot is empty.

        Shapes:
            value: ``(n,)``; returns ``(n,)``.
        """
        total = self.total()
        if not total > 0.0:
            raise ValueError(f"cannot search a PriorityTree whose total is {total}: fill or update some slots first")
        value = np.minimum(np.asarray(value, dtype=np.float64).reshape(-1), np.nextafter(total, 0.0))
        out = np.empty(value.size, dtype=np.int64)
        self._k.find(self._sum, self._offsets, self._sizes, self.depth, value, out)
        return out

    def draw(
        self, n: int, beta: float, slot_uid: np.ndarray, slot_use: np.ndarray, plan: Any = None
    ) -> Tuple[np.ndarray, np.ndarray, np.ndarray, Optional[np.ndarray]]:
        """A stratified draw: one slot from each of ``n`` equal slices of the total, with importance weights.

        Args:
            n: Number of slots to draw.
            beta: Importance-sampling exponent: weights ``(leaf / min leaf) ** -beta`` (0: all 1).
            slot_uid: The unique id each slot holds (returned for the drawn slots).
            slot_use: Use counts of the slots; each draw adds 1 to its slot's count.
            plan: ``packing.PackedPlan`` of the columns to copy for the drawn slots, or None.

        Returns:
            Slots (``int64``), weights (``float32``), unique ids (``int64``), and the drawn slots' packed columns as
            ``plan`` lays them out (None without a plan, or when a slot had to be redrawn: copy those rows then).

        Raises:
            RuntimeError: Every slot is empty, or the sums keep leading to empty slots.

        Shapes:
            slot_uid, slot_use: ``(slots,)`` with ``slots <= capacity``; returns ``(n,)`` each.
        """
        if self._dirty:
            self._flush()
        index, uid = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)
        weight = np.empty(n, dtype=np.float32)
        copy = plan or _NoCopy
        block = copy.block(n)
        empty, total = self._k.draw(
            self._sum, self._min, self._offsets, self._sizes, self.depth, self._rng, self.alpha, beta,
            slot_uid, slot_use, index, weight, uid, copy.source, copy.record, copy.table, block,
        )  # fmt: skip
        if empty < 0:
            raise RuntimeError(f"cannot draw from a PriorityTree whose total is {total}: every slot is empty")
        if empty:  # rounding landed on empty slots (essentially never): redraw those
            np.add.at(slot_use, index, -1)
            index = self._redraw_empty(index)
            np.add.at(slot_use, index, 1)
            scale = 1.0 / self._leaf(self.min())
            weight = (self._leaves[index] * scale).astype(np.float32) ** np.float32(-beta)
            return index, weight, slot_uid[index], None
        return index, weight, uid, None if plan is None else block

    def _redraw_empty(self, index: np.ndarray) -> np.ndarray:
        for attempt in range(8):
            bad = np.flatnonzero(self._leaves[index] <= 0.0)
            if bad.size == 0:
                return index
            if attempt == 4:  # the drift of the sums is the likely cause: rebuild them exactly
                self._refresh(0, self.capacity, minima=False)
            index[bad] = self.find(self._k.uniforms(self._rng, bad.size) * self.total())
        raise RuntimeError("the priority tree keeps returning empty slots: its sums are inconsistent with its leaves")

    def _count_updates(self, n: int) -> None:
        # every ``capacity`` leaf updates, rebuild the sums exactly to remove the rounding drift of adding changes
        self._updates_since_rebuild += n
        if self._updates_since_rebuild > self.capacity:
            self._refresh(0, self.capacity, minima=False)

    def _flush(self) -> None:
        for start, stop in self._dirty:
            self._refresh(start, stop)
        self._dirty.clear()

    def _refresh(self, start: int, stop: int, minima: bool = True) -> None:
        """Recompute, exactly, the ancestors of leaves ``[start, stop)``."""
        if start == 0 and stop == self.capacity:
            self._updates_since_rebuild = 0
        trees = [(self._sum, np.add)] + ([(self._min, np.minimum)] if minima else [])
        for k in range(1, self.depth + 1):
            start, stop = start // A, (stop - 1) // A + 1 if stop > start else start // A
            for flat, reduce in trees:
                children = flat[self._offsets[k - 1] :][: self._sizes[k - 1]].reshape(-1, A)[start:stop]
                out = flat[self._offsets[k] + start : self._offsets[k] + stop]
                # left to right, the order of the kernels' scans (NumPy's own sum pairs them differently)
                np.copyto(out, children[:, 0])
                for t in range(1, A):
                    reduce(out, children[:, t], out=out)


def _aligned(n: int) -> np.ndarray:
    """A ``float64`` array of ``n`` values starting on a 64-byte boundary (so groups of 8 siblings share a line)."""
    raw = np.empty(n + 8, dtype=np.float64)
    skip = (-raw.ctypes.data % 64) // 8
    return raw[skip : skip + n]
