"""The drawing half of the replay buffers: stratified prioritized or uniform draws and importance weights.

``Draws`` is a base class of ``BaseBuffer`` (``replay_core``), split off to keep each file readable; it reads the
buffer's state (trees, slot arrays, storage, random generators) and is not useful on its own. The compiled draw is
one kernel call (``numba_kernels.kary_draw``); the vectorized one does the same work in NumPy calls.
"""

from __future__ import annotations

from typing import Optional, Tuple

import numpy as np


class _NoPlan:
    """What the compiled draw copies when no columns are packed: nothing."""

    source = np.zeros(8, dtype=np.uint8)
    record = 8
    table = np.zeros((0, 4), dtype=np.int64)

    @staticmethod
    def block(n: int) -> np.ndarray:
        return _NoPlan.source


NO_PLAN = _NoPlan()


class Draws:
    """Drawing a batch's slots, weights and unique ids (see ``BaseBuffer``, which holds the state used here)."""

    def _draw(self, batch_size: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray, Optional[np.ndarray]]:
        """Slots, importance weights and unique ids of a new batch, and (compiled path) the batch's packed records
        already copied (else None); counts one use of each slot drawn."""
        filled = min(self._n_pushed - self._base, self.maxlen)
        if not self.prioritized and self._n_valid == filled:
            index = self._rng.integers(0, filled, batch_size)
            weight = np.ones(batch_size, dtype=np.float32)
        elif self._kernels is not None:
            return self._draw_compiled(batch_size)
        else:
            index, weight = self._draw_vectorized(batch_size)
        np.add.at(self._use, index, 1)
        return index, weight, self._uid.take(index), None

    def _draw_vectorized(self, batch_size: int) -> Tuple[np.ndarray, np.ndarray]:
        tree = self._sum_tree
        total = tree.total()
        # stratified: one draw from each of batch_size equal slices of the total priority
        value = np.arange(batch_size, dtype=np.float64)
        value += self._rng.random(batch_size)
        value *= total / batch_size
        index = tree.find(value)
        leaf = tree.leaves.take(index)
        if not (leaf > 0).all():
            index, leaf = self._redraw_empty(index, leaf)
        if not self.prioritized:
            return index, np.ones(batch_size, dtype=np.float32)
        return index, self._weights(leaf)

    def _min_leaf(self) -> float:
        if self._kernels is not None:  # the leaf function the kernels use, so the minimum weighs exactly 1
            return float(self._kernels.leaf_value(self._min_tree.min(), self.alpha))
        return self._min_tree.min() ** self.alpha

    def _draw_compiled(self, batch_size: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray, Optional[np.ndarray]]:
        tree = self._tree
        index = np.empty(batch_size, dtype=np.int64)
        weight = np.empty(batch_size, dtype=np.float32)
        uid = np.empty(batch_size, dtype=np.int64)
        # the kernel also copies the drawn samples' packed columns into one block: their cache misses overlap the
        # tree's, and each field is then an array without another copy
        plan = self._storage.packed_plan or NO_PLAN
        block = plan.block(batch_size)
        empty, total = self._kernels.draw(
            tree._sum, tree._min, tree._offsets, tree._sizes, tree.depth, self._kernel_rng,
            self.alpha, self.current_beta(), self._uid, self._use, index, weight, uid,
            plan.source, plan.record, plan.table, block,
        )  # fmt: skip
        if empty < 0:
            raise RuntimeError(f"cannot draw from a sum tree whose total is {total}; {len(self)} samples stored")
        if empty:  # rounding landed on empty slots (essentially never): redo them the vectorized way
            np.add.at(self._use, index, -1)
            index, leaf = self._redraw_empty(index, tree.leaves.take(index))
            weight = self._weights(leaf)
            np.add.at(self._use, index, 1)
            return index, weight, self._uid.take(index), None
        return index, weight, uid, None if plan is NO_PLAN else block

    def _weights(self, leaf: np.ndarray) -> np.ndarray:
        # w_i = (N P(i))^-beta / max_j (N P(j))^-beta = (leaf_i / min leaf)^-beta
        leaf = leaf * (1.0 / self._min_leaf())
        return np.power(leaf, -self.current_beta(), out=leaf).astype(np.float32)

    def _redraw_empty(self, index: np.ndarray, leaf: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        # Rounding at a boundary can land on an empty leaf; redraw those (it essentially never happens twice).
        for attempt in range(8):
            bad = np.flatnonzero(leaf <= 0)
            if bad.size == 0:
                return index, leaf
            if attempt == 4:
                self._sum_tree.rebuild()
            index[bad] = self._sum_tree.find(self._rng.random(bad.size) * self._sum_tree.total())
            leaf[bad] = self._sum_tree.leaves.take(index[bad])
        if (leaf <= 0).any():
            raise RuntimeError("the sum tree keeps returning empty slots; its totals are inconsistent with its leaves")
        return index, leaf

    def current_beta(self) -> float:
        """Importance-sampling exponent now: ``beta`` annealed linearly to 1 over ``beta_anneal_steps`` samples."""
        if self.beta_anneal_steps <= 0:
            return self.beta
        progress = min(1.0, self._n_sample_calls / self.beta_anneal_steps)
        return self.beta + (1.0 - self.beta) * progress
