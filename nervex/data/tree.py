"""Vectorized sum and min trees for prioritized replay.

Both trees hold ``capacity`` leaves (a power of two) and keep every level in one flat ``float64`` array. Every
operation works on a whole batch of leaves with one NumPy call per tree level; there is no per-item Python loop.
When numba is installed, ``SumTree``'s search and update run as compiled loops instead (see ``tree_kernels``).

Three choices differ from the textbook tree, all because NumPy pays ~0.3 us per call whatever the array size:

* The tree stops at a *top level* of at most ``top_size`` nodes instead of a single root. ``SumTree.find`` searches
  that level with one ``cumsum`` + ``searchsorted`` and only descends the levels below it, which saves ~9 levels
  (~25 calls) per search.
* ``SumTree.update`` adds the change of each leaf to all its ancestors in a single ``np.add.at`` call instead of
  recomputing the tree level by level. The floating-point drift this can cause is removed by an exact rebuild after
  every ``capacity`` leaf updates (amortized cost: a few nanoseconds per update).
* ``MinTree`` propagates lazily: the minimum is cached and the tree is only brought up to date when a change could
  have raised it (a leaf that held the minimum changed), which in prioritized replay is rare.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple, Union

import numpy as np

from .tree_kernels import default_backend, kernels

DEFAULT_TOP_SIZE = 512

IndexLike = Union[int, Sequence[int], np.ndarray]
ValueLike = Union[float, Sequence[float], np.ndarray]


def next_power_of_two(n: int) -> int:
    """The smallest power of two ``>= n`` (and ``>= 1``)."""
    return 1 << max(0, int(n) - 1).bit_length()


class _LevelTree:
    """Storage shared by the two trees: levels ``0`` (leaves) .. ``depth`` (top) in one flat array."""

    def __init__(self, capacity: int, top_size: int, fill: float) -> None:
        if capacity < 1:
            raise ValueError(f"tree capacity must be >= 1, got {capacity}")
        if top_size < 1:
            raise ValueError(f"tree top_size must be >= 1, got {top_size}")
        self.capacity = next_power_of_two(capacity)
        self.depth = 0
        while (self.capacity >> self.depth) > top_size:
            self.depth += 1
        sizes = [self.capacity >> k for k in range(self.depth + 1)]
        offsets = np.concatenate(([0], np.cumsum(sizes[:-1]))).astype(np.int64)
        self._fill = fill
        self._flat = np.full(int(sum(sizes)), fill, dtype=np.float64)
        self.levels: List[np.ndarray] = [self._flat[o : o + n] for o, n in zip(offsets, sizes)]
        # column vectors so that ``index >> shifts + offsets`` gives every ancestor of every leaf, shape (depth, n)
        self._shifts = np.arange(1, self.depth + 1, dtype=np.int64)[:, None]
        self._offsets = offsets[1:, None].copy()
        self._level_offsets = offsets
        self._marker = np.zeros(self.capacity, dtype=np.int64)
        self._arange = np.arange(0, dtype=np.int64)

    def deduplicate(self, index: np.ndarray, value: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """Keep one occurrence of each repeated index (with its value); order otherwise unchanged.

        Shapes:
            index, value: ``(n,)``; returns ``(m,)`` and ``(m,)`` with ``m <= n``.
        """
        n = index.size
        if n < 2:
            return index, value
        if self._arange.size < n:
            self._arange = np.arange(max(n, 2 * self._arange.size), dtype=np.int64)
        order = self._arange[:n]
        self._marker[index] = order  # one occurrence of each index wins the slot
        keep = self._marker.take(index) == order
        if keep.all():
            return index, value
        return index[keep], value[keep]

    @property
    def leaves(self) -> np.ndarray:
        """The leaf level (a view)."""
        return self.levels[0]

    def clear(self) -> None:
        self._flat.fill(self._fill)

    def _ancestors(self, index: np.ndarray) -> np.ndarray:
        """Flat positions of all ancestors (levels 1..depth) of each leaf; shape ``(depth * n,)``."""
        anc = np.right_shift(index, self._shifts)
        anc += self._offsets
        return anc.ravel()


def _as_index(index: IndexLike) -> np.ndarray:
    if type(index) is np.ndarray and index.dtype == np.int64 and index.ndim == 1:
        return index
    return np.asarray(index, dtype=np.int64).reshape(-1)


def _as_values(value: ValueLike, n: int) -> np.ndarray:
    if type(value) is np.ndarray and value.dtype == np.float64 and value.shape == (n,):
        return value
    value = np.asarray(value, dtype=np.float64).reshape(-1)
    if value.size == 1 and n != 1:
        value = np.full(n, value[0])
    if value.size != n:
        raise ValueError(f"got {n} leaf indices but {value.size} values; pass one value per index")
    return value


class SumTree(_LevelTree):
    """Sum over leaves with batched prefix-sum search.

    Args:
        capacity: Number of leaves; rounded up to a power of two.
        top_size: Largest level searched with ``cumsum`` instead of descending further (see module docstring).
        backend: ``'numpy'``, ``'numba'`` or None for ``tree_kernels.default_backend()``.

    Examples:
        >>> tree = SumTree(4)
        >>> tree.update([0, 1, 2, 3], [1.0, 2.0, 3.0, 4.0])
        >>> tree.total()
        10.0
        >>> tree.find(np.array([0.5, 1.0, 9.9])).tolist()
        [0, 1, 3]
    """

    def __init__(self, capacity: int, top_size: int = DEFAULT_TOP_SIZE, backend: Optional[str] = None) -> None:
        super().__init__(capacity, top_size, 0.0)
        self.backend = backend or default_backend()
        if self.backend not in ("numpy", "numba"):
            raise ValueError(f"SumTree backend must be 'numpy' or 'numba', got {self.backend!r}")
        self._kernels = kernels() if self.backend == "numba" else None
        self._repeat = np.zeros(0)
        self._prefix = np.zeros(len(self.levels[-1]) + 1)
        self._prefix_valid = False
        self._below_total = 0.0
        self._updates_since_rebuild = 0

    def clear(self) -> None:
        super().clear()
        self._prefix_valid = False
        self._updates_since_rebuild = 0

    def update(self, index: IndexLike, value: ValueLike, unique: bool = False) -> None:
        """Set ``leaves[index] = value`` and update every ancestor.

        Args:
            index: Leaf indices; duplicates are allowed (one of the duplicated values is kept).
            value: New leaf values (non-negative), one per index or a single value for all.
            unique: The caller guarantees ``index`` has no duplicates (skips ``deduplicate``).

        Shapes:
            index: ``(n,)``; value: ``(n,)`` or scalar.
        """
        index = _as_index(index)
        if index.size == 0:
            return
        value = _as_values(value, index.size)
        if self._kernels is not None:
            self._kernels.sum_update(self._flat, self._level_offsets, self.depth, index, value)
            self.note_external_update(index.size)
            return
        if not unique:
            index, value = self.deduplicate(index, value)
        n = index.size
        delta = value - self.leaves.take(index)
        self.leaves[index] = value
        if self.depth:
            if self._repeat.size < self.depth * n:
                self._repeat = np.zeros(max(self.depth * n, 2 * self._repeat.size))
            repeated = self._repeat[: self.depth * n]
            repeated.reshape(self.depth, n)[...] = delta
            np.add.at(self._flat, self._ancestors(index), repeated)
        self.note_external_update(n)

    def note_external_update(self, n: int) -> None:
        """Account for ``n`` leaf updates that a compiled kernel applied directly to the levels."""
        self._prefix_valid = False
        self._updates_since_rebuild += n
        if self._updates_since_rebuild > self.capacity:
            self.rebuild()

    def refresh(self, start: int, stop: int) -> None:
        """Recompute, exactly, the ancestors of ``leaves[start:stop]`` after writing those leaves directly."""
        if not 0 <= start <= stop <= self.capacity:
            raise ValueError(f"refresh range [{start}, {stop}) is outside the tree's leaves [0, {self.capacity})")
        if start == stop:
            return
        for k in range(1, self.depth + 1):
            start, stop = start >> 1, ((stop - 1) >> 1) + 1
            child = self.levels[k - 1]
            np.add(child[2 * start : 2 * stop : 2], child[2 * start + 1 : 2 * stop : 2], out=self.levels[k][start:stop])
        self._prefix_valid = False

    def rebuild(self) -> None:
        """Recompute every internal node from the leaves (removes accumulated rounding drift)."""
        self.refresh(0, self.capacity)
        self._updates_since_rebuild = 0

    def total(self) -> float:
        """Sum of all leaves."""
        if not self._prefix_valid:
            self.levels[-1].cumsum(out=self._prefix[1:])
            self._below_total = np.nextafter(self._prefix[-1], 0.0)
            self._prefix_valid = True
        return float(self._prefix[-1])

    def find(self, value: np.ndarray) -> np.ndarray:
        """For each ``v``, the leaf ``i`` with ``sum(leaves[:i]) <= v < sum(leaves[:i + 1])``.

        Leaves of value 0 are never returned except through floating-point rounding at a boundary; callers that must
        exclude them check the returned leaves.

        Args:
            value: Prefix sums in ``[0, total())``; values at or above the total are clipped just below it.

        Returns:
            Leaf indices, ``int64``.

        Shapes:
            value: ``(n,)``; returns ``(n,)``.
        """
        total = self.total()
        if not total > 0.0:
            raise ValueError(f"cannot search a SumTree whose total is {total}; set some leaves > 0 first")
        if self._kernels is not None:
            value = np.ascontiguousarray(value, dtype=np.float64)
            out = np.empty(value.size, dtype=np.int64)
            self._kernels.find(self._flat, self._level_offsets, self.depth, self._prefix, self._below_total, value, out)
            return out
        v = np.minimum(value, self._below_total, dtype=np.float64)
        idx = self._prefix.searchsorted(v, side="right")
        idx -= 1
        v -= self._prefix.take(idx)
        for level in self.levels[-2::-1]:
            idx <<= 1
            left = level.take(idx)
            go_right = v >= left
            left *= go_right
            v -= left
            idx += go_right
        return idx


class MinTree(_LevelTree):
    """Minimum over leaves; ``+inf`` marks an empty leaf.

    The minimum ``m`` is cached together with a lower bound on the number of leaves that hold it. An update that
    lowers ``m`` or adds holders adjusts the cache; one that removes the last known holder marks it stale, and the
    next ``min()`` brings the pending part of the tree up to date (vectorized, one batch per level) and reads the top
    level. Ties (many leaves at the priority floor) therefore do not make every update recompute.

    With the numba backend the tree is instead updated eagerly, leaf by leaf, stopping as soon as an ancestor is
    unchanged; ``min()`` then reads the top level.

    Args:
        capacity: Number of leaves; rounded up to a power of two.
        top_size: Number of nodes of the top level, whose minimum ``min()`` computes directly.
        backend: ``'numpy'``, ``'numba'`` or None for ``tree_kernels.default_backend()``.

    Examples:
        >>> tree = MinTree(4)
        >>> tree.update([0, 1, 2], [3.0, 1.0, 2.0])
        >>> tree.min()
        1.0
        >>> tree.update([1], [np.inf])
        >>> tree.min()
        2.0
    """

    def __init__(self, capacity: int, top_size: int = DEFAULT_TOP_SIZE, backend: Optional[str] = None) -> None:
        super().__init__(capacity, top_size, np.inf)
        self.backend = backend or default_backend()
        if self.backend not in ("numpy", "numba"):
            raise ValueError(f"MinTree backend must be 'numpy' or 'numba', got {self.backend!r}")
        self._kernels = kernels() if self.backend == "numba" else None
        self.clear()

    def clear(self) -> None:
        super().clear()
        self._min = np.inf
        self._holders = 0  # lower bound on the number of leaves equal to _min (0 with _min = inf)
        self._stale = False
        self._pending: List[np.ndarray] = []
        self._pending_size = 0
        self._needs_rebuild = False

    def update(self, index: IndexLike, value: ValueLike, unique: bool = False) -> None:
        """Set ``leaves[index] = value`` (``inf`` empties a leaf).

        Args:
            index: Leaf indices; duplicates are allowed (one of the duplicated values is kept).
            value: New values, one per index or a single value for all.
            unique: The caller guarantees ``index`` has no duplicates (skips ``deduplicate``).

        Shapes:
            index: ``(n,)``; value: ``(n,)`` or scalar.
        """
        index = _as_index(index)
        if index.size == 0:
            return
        value = _as_values(value, index.size)
        if self._kernels is not None:
            self._kernels.min_update(self._flat, self._level_offsets, self.depth, index, value)
            self.note_external_update()
            return
        if not unique:
            index, value = self.deduplicate(index, value)
        old = self.leaves.take(index)
        self.leaves[index] = value
        self._note_change(old, value, index)

    def update_range(self, start: int, stop: int, value: ValueLike) -> None:
        """Set ``leaves[start:stop] = value`` (cheaper than ``update`` with an index array)."""
        if not 0 <= start <= stop <= self.capacity:
            raise ValueError(f"range [{start}, {stop}) is outside the tree's leaves [0, {self.capacity})")
        if start == stop:
            return
        if self._kernels is not None:
            values = np.broadcast_to(np.asarray(value, dtype=np.float64), (stop - start,)).copy()
            self._kernels.min_update(self._flat, self._level_offsets, self.depth, np.arange(start, stop), values)
            self.note_external_update()
            return
        leaves = self.leaves[start:stop]
        old = leaves.copy()
        leaves[...] = value
        self._note_change(old, leaves, None, start, stop)

    def refresh(self, start: int, stop: int, old_min: float = -np.inf) -> None:
        """Recompute, exactly, the ancestors of ``leaves[start:stop]`` after writing those leaves directly.

        Args:
            start, stop: The range of leaves written.
            old_min: The smallest value those leaves held before (the default assumes the worst).
        """
        if not 0 <= start <= stop <= self.capacity:
            raise ValueError(f"refresh range [{start}, {stop}) is outside the tree's leaves [0, {self.capacity})")
        if start == stop:
            return
        lo, hi = start, stop
        for k in range(1, self.depth + 1):
            lo, hi = lo >> 1, ((hi - 1) >> 1) + 1
            child = self.levels[k - 1]
            np.minimum(child[2 * lo : 2 * hi : 2], child[2 * lo + 1 : 2 * hi : 2], out=self.levels[k][lo:hi])
        if self._kernels is not None:
            self._stale = True  # reading the top level is cheap: nothing is pending with eager updates
        elif not self._stale:  # the range is exact now; only the cached minimum needs care
            new = self.leaves[start:stop]
            new_min = new.min()
            if new_min < self._min:
                self._min, self._holders = new_min, int(np.count_nonzero(new == new_min))
            elif old_min <= self._min:
                self._stale = True  # an overwritten leaf may have held the minimum
            elif new_min == self._min:
                self._holders += int(np.count_nonzero(new == new_min))

    def note_external_update(self) -> None:
        """Mark the cached minimum stale after a compiled kernel updated the tree eagerly (numba backend)."""
        self._stale = True

    def min(self) -> float:
        """Minimum over all leaves (``inf`` when every leaf is empty)."""
        if self._stale:
            self._propagate()
            top = self.levels[-1]
            self._min = float(top.min())
            # subtrees of the top level whose minimum is m: each holds at least one leaf equal to m
            self._holders = int(np.count_nonzero(top == self._min)) if self._min < np.inf else 0
            self._stale = False
        return float(self._min)

    def rebuild(self) -> None:
        """Recompute every internal node from the leaves."""
        for k in range(1, self.depth + 1):
            child = self.levels[k - 1]
            np.minimum(child[0::2], child[1::2], out=self.levels[k])
        self._pending, self._pending_size, self._needs_rebuild = [], 0, False
        self._stale = True  # recount the holders from the fresh top level

    def _note_change(
        self, old: np.ndarray, new: np.ndarray, index: Optional[np.ndarray], start: int = 0, stop: int = 0
    ) -> None:
        if not self._stale:
            m = self._min
            new_min = new.min()
            if new_min < m:
                self._min, self._holders = new_min, int(np.count_nonzero(new == new_min))
            else:
                if new_min == m:
                    self._holders += int(np.count_nonzero(new == m))
                if old.min() == m:
                    self._holders -= int(np.count_nonzero(old == m))
                    self._stale = self._holders <= 0
        if self.depth == 0 or self._needs_rebuild:
            return
        if index is None:
            index = np.arange(start, stop, dtype=np.int64)
        self._pending.append(index)
        self._pending_size += index.size
        if self._pending_size > self.capacity // 4:
            # cheaper to rebuild everything later than to keep (and walk) this many pending leaves
            self._pending, self._pending_size, self._needs_rebuild = [], 0, True

    def _propagate(self) -> None:
        if self._needs_rebuild:
            self.rebuild()
            return
        if not self._pending:
            return
        idx = self._pending[0] if len(self._pending) == 1 else np.concatenate(self._pending)
        for k in range(1, self.depth + 1):
            idx = np.right_shift(idx, 1)
            pairs = self.levels[k - 1].reshape(-1, 2).take(idx, axis=0)
            self.levels[k][idx] = np.minimum(pairs[:, 0], pairs[:, 1])
        self._pending, self._pending_size = [], 0
