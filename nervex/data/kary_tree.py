"""``KaryTree``: a sum tree and a min tree with ``arity`` (8 or 16) children per node, for prioritized replay.

Why not the binary ``SumTree``: at 1M leaves a binary descent touches ~20 levels and nearly every level is a cache
miss. Here the ``arity`` children of a node are contiguous ``float64`` (8 of them fill one 64-byte line), so a
descent touches ~7 lines for 1M leaves and scans each one, and an update reads the same ~7 lines to refresh the
ancestors.

Layout: all levels live in one flat array, top level first, leaves last (so ``leaves`` is a contiguous view). Level
``k`` counts up from the leaves (``0``) to the top (``depth``); node ``j`` of level ``k + 1`` has children
``j * arity .. j * arity + arity - 1`` of level ``k``. The top level has at most ``arity`` nodes; ``total()`` and
``min()`` reduce it directly.

Exactness: an update adds the change of each leaf to each ancestor (one line per level), and the sums are rebuilt
exactly every ``capacity`` updates to remove the drift. The min tree, updated in the same pass (walking up only while
an ancestor can change), is always exact: the importance weights are normalized by the minimum priority.

Backends: compiled numba kernels when numba imports (see ``tree_kernels.default_backend``), else NumPy vectorized per
level. Both make the same comparisons and add the same changes to the sums; where rounding differs, results agree up
to rounding (the tests use exactly representable values). The NumPy path is for correctness without numba: it makes
~3x more calls per batch than the binary trees' NumPy code, so the buffer keeps those when numba is absent.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Callable, Optional, Tuple

import numpy as np

from .tree_kernels import default_backend, numba_available


class KaryTree:
    """Sum and min over the same leaves, with batched stratified search.

    Args:
        capacity: Number of leaves; rounded up to a power of two (and at least ``arity``).
        arity: Children per node, a power of two >= 2 (8: one cache line of ``float64``).
        backend: ``'numpy'``, ``'numba'`` (arity 8 only) or None for ``tree_kernels.default_backend()`` (NumPy for
            other arities).

    Examples:
        >>> tree = KaryTree(16, backend="numpy")
        >>> tree.update(np.array([0, 9]), np.array([1.0, 3.0]), np.array([1.0, 3.0]))
        >>> tree.total(), tree.min()
        (4.0, 1.0)
        >>> tree.find(np.array([0.5, 1.0, 3.9])).tolist()
        [0, 9, 9]
    """

    def __init__(self, capacity: int, arity: int = 8, backend: Optional[str] = None) -> None:
        if capacity < 1:
            raise ValueError(f"KaryTree capacity must be >= 1, got {capacity}")
        if arity < 2 or arity & (arity - 1):
            raise ValueError(f"KaryTree arity must be a power of two >= 2, got {arity}")
        self.arity = int(arity)
        self.capacity = max(self.arity, 1 << max(0, int(capacity) - 1).bit_length())
        sizes = [self.capacity]
        while sizes[-1] > self.arity:
            sizes.append(sizes[-1] // self.arity)  # exact: both are powers of two
        self.depth = len(sizes) - 1
        # top-down storage: level k starts at offsets[k]; the top level (k = depth) comes first, padded to ``arity``
        # slots so that every group of siblings starts on a multiple of ``arity`` (with 8: on a cache line)
        stored = sizes[:-1] + [self.arity]
        starts = np.concatenate(([0], np.cumsum(stored[::-1])[:-1]))[::-1]
        self._offsets = np.ascontiguousarray(starts, dtype=np.int64)
        self._sizes = np.asarray(sizes, dtype=np.int64)
        self._sum = _aligned(int(sum(stored)), 0.0)
        self._min = _aligned(int(sum(stored)), np.inf)
        # the compiled kernels exist for arity 8 (one cache line per group of siblings) only
        self.backend = backend or (default_backend() if self.arity == 8 else "numpy")
        if self.backend not in ("numpy", "numba"):
            raise ValueError(f"KaryTree backend must be 'numpy' or 'numba', got {self.backend!r}")
        self._kernels = kary_kernels(self.arity) if self.backend == "numba" else None
        self._updates_since_rebuild = 0
        # cached views: the buffer writes one leaf per append, so building a slice each time would show
        self._leaves = self._level(self._sum, 0)
        self._min_leaves = self._level(self._min, 0)

    def _level(self, flat: np.ndarray, k: int) -> np.ndarray:
        start = int(self._offsets[k])
        return flat[start : start + int(self._sizes[k])]

    @property
    def leaves(self) -> np.ndarray:
        """The sum tree's leaves (a view; call ``refresh`` after writing them directly)."""
        return self._leaves

    @property
    def min_leaves(self) -> np.ndarray:
        """The min tree's leaves (a view; ``inf`` marks an empty leaf)."""
        return self._min_leaves

    def clear(self) -> None:
        self._sum.fill(0.0)
        self._min.fill(np.inf)
        self._pad_top()

    def _pad_top(self) -> None:
        # the padding of the top level stays neutral (0 for sums, inf for minima)
        top = int(self._offsets[self.depth])
        self._sum[top + int(self._sizes[self.depth]) : top + self.arity] = 0.0
        self._min[top + int(self._sizes[self.depth]) : top + self.arity] = np.inf

    def total(self) -> float:
        """Sum of all leaves."""
        # a running sum, in the order the search adds siblings, so a value clipped below it never passes the end
        return float(np.cumsum(self._level(self._sum, self.depth))[-1])

    def min(self) -> float:
        """Minimum over the min tree's leaves (``inf`` when all are empty)."""
        return float(self._level(self._min, self.depth).min())

    def update(self, index: np.ndarray, sum_value: Any, min_value: Any, unique: bool = False) -> None:
        """Set ``leaves[index] = sum_value`` and ``min_leaves[index] = min_value``; refresh every ancestor.

        A repeated index keeps its last value. ``unique``: the caller guarantees no repeats (skips a sort).

        Shapes:
            index, sum_value, min_value: ``(n,)``.
        """
        index = np.ascontiguousarray(index, dtype=np.int64).reshape(-1)
        sum_value = np.ascontiguousarray(np.broadcast_to(sum_value, index.shape), dtype=np.float64)
        min_value = np.ascontiguousarray(np.broadcast_to(min_value, index.shape), dtype=np.float64)
        if index.size == 0:
            return
        if index.min() < 0 or index.max() >= self.capacity:
            raise ValueError(f"KaryTree leaf index must be in [0, {self.capacity}), got {index.min()}..{index.max()}")
        if self._kernels is not None:
            self._kernels.update(self._sum, self._min, self._offsets, self.depth, index, sum_value, min_value)
            self.note_external_update(index.size)
            return
        if not unique:  # last occurrence wins, as in the sequential kernel
            _, first = np.unique(index[::-1], return_index=True)
            keep = index.size - 1 - first
            index, sum_value, min_value = index[keep], sum_value[keep], min_value[keep]
        delta = sum_value - self.leaves.take(index)
        self.leaves[index] = sum_value
        self.min_leaves[index] = min_value
        self._refresh_nodes(index, delta)
        self.note_external_update(index.size)

    def refresh(self, start: int, stop: int, sums: bool = True, minima: bool = True) -> None:
        """Recompute, exactly, the ancestors of leaves ``[start, stop)`` after writing those leaves directly.

        Args:
            start, stop: The range of leaves written.
            sums, minima: Which of the two trees to refresh.
        """
        if not 0 <= start <= stop <= self.capacity:
            raise ValueError(f"refresh range [{start}, {stop}) is outside the tree's leaves [0, {self.capacity})")
        if start == 0 and stop == self.capacity and sums:
            self._updates_since_rebuild = 0
        trees = [(flat, op) for flat, op, on in ((self._sum, np.add, sums), (self._min, np.minimum, minima)) if on]
        a = self.arity
        for k in range(1, self.depth + 1):
            start, stop = start // a, (stop - 1) // a + 1 if stop > start else start // a
            for flat, reduce in trees:
                _reduce_siblings(
                    reduce, self._level(flat, k - 1).reshape(-1, a)[start:stop], self._level(flat, k)[start:stop]
                )

    def note_external_update(self, n: int) -> None:
        """Count ``n`` leaf updates a compiled kernel applied by adding changes to the sums; every ``capacity`` of
        them, rebuild the sums exactly to remove the rounding drift."""
        self._updates_since_rebuild += n
        if self._updates_since_rebuild > self.capacity:
            self.refresh(0, self.capacity, minima=False)

    def _refresh_nodes(self, index: np.ndarray, delta: np.ndarray) -> None:
        if self.depth == 0:
            return
        a = self.arity
        # sums: every ancestor of every leaf gets its leaf's change, in one call (the kernel's arithmetic)
        shifts = np.arange(1, self.depth + 1, dtype=np.int64)[:, None] * (a.bit_length() - 1)
        ancestors = np.right_shift(index, shifts) + self._offsets[1:, None]
        np.add.at(self._sum, ancestors.ravel(), np.broadcast_to(delta, ancestors.shape).ravel())
        # minima: recomputed exactly from the children, level by level (a repeated parent gets the same value twice)
        for k in range(1, self.depth + 1):
            index = index // a
            self._level(self._min, k)[index] = self._level(self._min, k - 1).reshape(-1, a).take(index, axis=0).min(1)

    def find(self, value: np.ndarray) -> np.ndarray:
        """For each ``v``, the leaf ``i`` with ``sum(leaves[:i]) <= v < sum(leaves[:i + 1])``.

        Args:
            value: Prefix sums in ``[0, total())``; values at or above the total are clipped just below it.

        Returns:
            Leaf indices, ``int64``. Rounding at a boundary can return an empty leaf; callers check.

        Shapes:
            value: ``(n,)``; returns ``(n,)``.
        """
        total = self.total()
        if not total > 0.0:
            raise ValueError(f"cannot search a KaryTree whose total is {total}; set some leaves > 0 first")
        value = np.minimum(np.asarray(value, dtype=np.float64).reshape(-1), np.nextafter(total, 0.0))
        if self._kernels is not None:
            out = np.empty(value.size, dtype=np.int64)
            self._kernels.find(self._sum, self._offsets, self._sizes, self.depth, value, out)
            return out
        top = self._level(self._sum, self.depth)
        idx, v = _scan(np.broadcast_to(top, (value.size, top.size)), value)
        for k in range(self.depth - 1, -1, -1):
            children = self._level(self._sum, k).reshape(-1, self.arity).take(idx, axis=0)
            c, v = _scan(children, v)
            idx = idx * self.arity + c
        return idx

    def sample(self, rand: np.ndarray) -> Tuple[np.ndarray, int]:
        """Stratified draw: one leaf from each of ``n`` equal slices of the total; also counts empty leaves hit.

        Shapes:
            rand: ``(n,)`` uniform in ``[0, 1)``; returns ``(n,)`` leaf indices.
        """
        n = rand.size
        value = (np.arange(n, dtype=np.float64) + rand) * (self.total() / n)
        index = self.find(value)
        return index, int(np.count_nonzero(self.leaves.take(index) <= 0.0))


def _reduce_siblings(reduce: np.ufunc, children: np.ndarray, out: np.ndarray) -> None:
    """``out = children[:, 0] op children[:, 1] op ...`` left to right, the order the compiled kernels use (NumPy's
    own ``sum`` pairs them differently, and sums must match bit for bit across backends)."""
    np.copyto(out, children[:, 0])
    for t in range(1, children.shape[1]):
        reduce(out, children[:, t], out=out)


def _aligned(n: int, fill: float) -> np.ndarray:
    """A ``float64`` array of ``n`` values starting on a 64-byte boundary (so groups of 8 siblings share a line)."""
    raw = np.full(n + 8, fill, dtype=np.float64)
    skip = (-raw.ctypes.data % 64) // 8
    return raw[skip : skip + n]


def _scan(children: np.ndarray, v: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Per row, the child where the running sum passes ``v`` (last child if never) and ``v`` minus what precedes."""
    n, a = children.shape
    cs = np.zeros((n, a + 1))  # running sums with a leading 0, so "what precedes child c" is cs[:, c]
    np.cumsum(children, axis=1, out=cs[:, 1:])
    c = np.count_nonzero(cs[:, 1:a] <= v[:, None], axis=1)  # only the first a - 1 sums: never past the last child
    # rounding can leave v at or above the sums of all the non-empty children: never step onto the empty ones after
    last = (a - 1) - np.argmax(children[:, ::-1] > 0, axis=1)
    np.minimum(c, last, out=c)
    return c, v - cs[np.arange(n), c]


def kary_kernels(arity: int) -> Any:
    """The compiled kernels (``find``, ``update``, ``draw``, ``update_priorities``); they exist for arity 8 only.

    Raises:
        ImportError: numba cannot be imported.
        ValueError: another arity (use ``backend='numpy'`` for it).
    """
    if not numba_available():
        raise ImportError("the numba KaryTree backend needs numba")
    from . import numba_kernels as nk

    if arity != nk.A:
        raise ValueError(f"the numba KaryTree backend is compiled for arity {nk.A}, got {arity}; use backend='numpy'")
    return SimpleNamespace(
        find=nk.kary_find,
        update=nk.kary_update,
        draw=nk.kary_draw,
        update_priorities=nk.kary_update_priorities,
        leaf_value=nk.leaf_value,
        uniforms=nk.uniforms,
    )


class KarySumView:
    """The sum half of a ``KaryTree`` with ``SumTree``'s interface, as the replay buffer uses it."""

    def __init__(self, tree: KaryTree, flush: Optional[Callable[[], None]] = None) -> None:
        self.tree = tree
        self.backend = tree.backend
        self.capacity = tree.capacity
        # the buffer writes leaves lazily; reading the total first propagates them (as with a one-level SumTree)
        self._flush = flush

    @property
    def leaves(self) -> np.ndarray:
        return self.tree._leaves

    def clear(self) -> None:
        self.tree.clear()

    def refresh(self, start: int, stop: int) -> None:
        self.tree.refresh(start, stop, minima=False)

    def rebuild(self) -> None:
        self.tree.refresh(0, self.capacity, minima=False)

    def update(self, index: np.ndarray, value: Any, unique: bool = False) -> None:
        index = np.asarray(index, dtype=np.int64).reshape(-1)
        self.tree.update(index, value, self.tree.min_leaves.take(index), unique)

    def deduplicate(self, index: np.ndarray, value: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """Keep the last occurrence of each repeated index (as ``update`` would)."""
        _, first = np.unique(index[::-1], return_index=True)
        keep = np.sort(index.size - 1 - first)
        return index[keep], value[keep]

    def total(self) -> float:
        if self._flush is not None:
            self._flush()
        return self.tree.total()

    def find(self, value: np.ndarray) -> np.ndarray:
        return self.tree.find(value)


class KaryMinView:
    """The min half of a ``KaryTree`` with ``MinTree``'s interface, as the replay buffer uses it."""

    def __init__(self, tree: KaryTree) -> None:
        self.tree = tree
        self.backend = tree.backend
        self.capacity = tree.capacity

    @property
    def leaves(self) -> np.ndarray:
        return self.tree._min_leaves

    def clear(self) -> None:
        self.tree.clear()

    def refresh(self, start: int, stop: int, old_min: float = -np.inf) -> None:
        self.tree.refresh(start, stop, sums=False)

    def rebuild(self) -> None:
        self.tree.refresh(0, self.capacity, sums=False)

    def update(self, index: np.ndarray, value: Any, unique: bool = False) -> None:
        index = np.asarray(index, dtype=np.int64).reshape(-1)
        self.tree.update(index, self.tree.leaves.take(index), value, unique)

    def min(self) -> float:
        return self.tree.min()
