"""``BaseBuffer``: the implementation shared by ``PrioritizedBuffer`` and ``ReplayBuffer`` (see ``buffer.py``).

Both keep samples in a ``ColumnStorage`` (one preallocated array per field) used as a ring of ``maxlen`` slots:
the ``k``-th sample ever stored gets ``unique_id = k`` and lives in slot ``k % maxlen`` until it is overwritten or
evicted. Priorities live in a sum tree (sampling) and a min tree (importance-weight normalization): with numba, one
``KaryTree`` (8-ary, both trees over the same leaves) seen through ``SumTree``/``MinTree``-like views; with NumPy
only, the binary ``SumTree`` and ``MinTree``, whose vectorized code is faster there.

Sampling returns a dict of torch tensors: every sample field stacked on dim 0 (nested dicts kept nested), plus
``weight`` (importance-sampling weights, ``float32``), ``index`` (slots) and ``unique_id`` (both ``int64``). It
returns ``None`` when fewer than ``batch_size`` samples are stored or when the ``samples_per_insert`` rate limit
would be exceeded (``timeout`` makes it wait for the writer instead).

Threads: one writer (``append``/``extend``) and one reader (``sample``/``update``) may run at the same time; one lock
guards the bookkeeping, and conversion, compression and decompression happen outside it.
"""

from __future__ import annotations

import bisect
import threading
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from .draw import Draws
from .kary_tree import KaryMinView, KarySumView, KaryTree
from .storage import ColumnStorage
from .tree import MinTree, SumTree
from .tree_kernels import default_backend

ArrayLike = Union[np.ndarray, torch.Tensor, Sequence[float]]
Batch = Dict[str, Any]


def _to_numpy(x: Any, dtype: type) -> np.ndarray:
    if type(x) is np.ndarray and x.dtype == dtype and x.ndim == 1 and x.flags.c_contiguous:
        return x
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().numpy()
    return np.ascontiguousarray(np.asarray(x, dtype=dtype).reshape(-1))


class BaseBuffer(Draws):
    """Shared implementation of the two buffers (use ``PrioritizedBuffer`` or ``ReplayBuffer``)."""

    config: Dict[str, Any] = {}

    def __init__(
        self,
        maxlen: int,
        prioritized: bool,
        alpha: float = 0.6,
        beta: float = 0.4,
        beta_anneal_steps: int = 0,
        eps: float = 1e-6,
        max_use: Optional[int] = None,
        max_staleness: Optional[int] = None,
        samples_per_insert: Optional[float] = None,
        compress_fields: Sequence[str] = (),
        seed: Optional[int] = None,
    ) -> None:
        _check_args(maxlen, alpha, beta, beta_anneal_steps, eps, max_use, max_staleness, samples_per_insert)
        if isinstance(compress_fields, str):
            compress_fields = (compress_fields,)
        self.maxlen = int(maxlen)
        self.prioritized = bool(prioritized)
        self.alpha, self.beta, self.beta_anneal_steps, self.eps = float(alpha), float(beta), int(beta_anneal_steps), eps
        self.max_use = None if max_use is None else int(max_use)
        self.max_staleness = None if max_staleness is None else int(max_staleness)
        self.samples_per_insert = None if samples_per_insert is None else float(samples_per_insert)
        self._storage = ColumnStorage(self.maxlen, compress_fields)
        self._uid = np.full(self.maxlen, -1, dtype=np.int64)  # -1: empty or evicted
        self._use = np.zeros(self.maxlen, dtype=np.int64)
        self._insert_iter = np.zeros(self.maxlen, dtype=np.int64)
        # uniform sampling needs a tree only once evictions leave holes in the ring
        needs_tree = self.prioritized or self.max_use is not None or self.max_staleness is not None
        # the min tree's leaves are the raw priorities (inf: empty); min leaf of the sum tree = min priority ** alpha
        self._tree: Optional[KaryTree] = None
        if needs_tree and default_backend() == "numba":
            # 8 children per node fill one cache line: ~7 levels per search at 1M slots instead of ~20 (kary_tree);
            # compiled, this is ~1.5x faster per sample+update than the binary trees at 1M slots
            self._tree = KaryTree(self.maxlen, backend="numba")
            self._sum_tree = KarySumView(self._tree, self._flush)
            self._min_tree = KaryMinView(self._tree) if self.prioritized else None
        else:
            # vectorized NumPy is ~3x faster on the binary trees (fewer, larger calls per level; see tree.py)
            self._sum_tree = SumTree(self.maxlen, backend="numpy") if needs_tree else None
            self._min_tree = MinTree(self.maxlen, backend="numpy") if self.prioritized else None
        # compiled sample/update paths; the NumPy paths below do the same work in vectorized calls
        self._kernels = self._tree._kernels if self.prioritized and self._tree is not None else None
        self._cond = threading.Condition(threading.Lock())
        self._rng = np.random.default_rng(seed)
        # the compiled draw's own generator (splitmix64), seeded from the buffer's, so a seeded buffer stays
        # reproducible
        self._kernel_rng = self._rng.integers(0, 2**63, size=1, dtype=np.int64).astype(np.uint64)
        self._n_pushed = 0  # unique ids handed out so far; never reset, so ids stay unique across clear()/load()
        self._reset()

    def _reset(self) -> None:
        self._base = self._n_pushed  # unique id that goes to slot 0
        self._pending_from = self._stale_from = self._n_pushed
        self._n_valid = self._n_sampled = self._n_sample_calls = 0
        self._max_priority = 1.0
        self._max_leaf_of = (1.0, 1.0)  # (max priority, its leaf) for the compiled path
        self._overwritten_min = np.inf  # smallest priority overwritten since the last flush (for the min tree)
        self._evicted_use = self._evicted_stale = self._ignored_updates = 0
        self._last_insert_iter = self._learner_iter = 0
        self._last_index: Optional[np.ndarray] = None
        self._last_uid: Optional[np.ndarray] = None
        self._waiting = 0
        self._stats_time, self._stats_pushed, self._stats_sampled = time.monotonic(), self._n_pushed, 0
        self._uid.fill(-1)
        self._use.fill(0)
        self._insert_iter.fill(0)
        for tree in (self._sum_tree, self._min_tree):
            if tree is not None:
                tree.clear()

    # ---- writing ---------------------------------------------------------------------------------------------
    def append(self, sample: Mapping[str, Any], learner_iter: int = 0) -> None:
        """Store one sample (a dict of arrays and numbers, possibly nested).

        Args:
            sample: The sample; the first one stored fixes the fields, dtypes and shapes.
            learner_iter: The learner's iteration now, for ``max_staleness`` and the staleness figures.

        Raises:
            ValueError: The sample's fields or shapes differ from the first sample's (the message names the field
                and both shapes), or a field is not numeric.
        """
        self._ensure_schema(sample, batched=False)
        row = self._storage.convert_one(sample)
        with self._cond:
            self._check_learner_iter(learner_iter)
            slot = (self._n_pushed - self._base) % self.maxlen
            self._storage.write_one(slot, row)
            if self._uid[slot] >= 0:
                self._n_valid -= 1
            self._uid[slot] = self._n_pushed
            self._use[slot] = 0
            self._insert_iter[slot] = learner_iter
            if self._sum_tree is not None:
                self._sum_tree.leaves[slot] = self._max_leaf()  # propagated lazily, see _flush
            if self._min_tree is not None:
                self._overwritten_min = min(self._overwritten_min, self._min_tree.leaves[slot])
                self._min_tree.leaves[slot] = self._max_priority
            self._n_pushed += 1
            self._n_valid += 1
            if self._waiting:
                self._cond.notify_all()

    def extend(self, samples: Sequence[Mapping[str, Any]], learner_iter: int = 0) -> None:
        """Store a list of samples (faster than ``append`` in a loop). A dict is passed on to ``extend_batch``.

        Raises:
            ValueError: As ``append``; nothing is stored when any sample is invalid.
        """
        if isinstance(samples, Mapping):
            self.extend_batch(samples, learner_iter)
            return
        if len(samples) == 0:
            return
        self._ensure_schema(samples[0], batched=False)
        self._write(self._storage.convert_many(samples), len(samples), learner_iter)

    def extend_batch(self, batch: Mapping[str, Any], learner_iter: int = 0) -> None:
        """Store a batch given as a dict of arrays with a leading batch dimension (the fastest way to add).

        Shapes:
            batch: every leaf ``(n, *field_shape)``.
        """
        self._ensure_schema(batch, batched=True)
        values, n = self._storage.convert_batch(batch)
        if n:
            self._write(values, n, learner_iter)

    def _ensure_schema(self, sample: Mapping[str, Any], batched: bool) -> None:
        if not self._storage.ready:
            with self._cond:
                if not self._storage.ready:
                    self._storage.init_schema(sample, batched=batched)

    def _write(self, values: List[Any], n: int, learner_iter: int) -> None:
        with self._cond:
            self._check_learner_iter(learner_iter)
            pos = max(0, n - self.maxlen)  # rows older than the last maxlen would be overwritten by this very batch
            while pos < n:
                uid = self._n_pushed + pos
                slot = (uid - self._base) % self.maxlen
                k = min(n - pos, self.maxlen - slot)
                self._storage.write_rows(slot, values, pos, pos + k)
                self._mark_written(slot, uid, k, learner_iter)
                pos += k
            self._n_pushed += n
            if self._waiting:
                self._cond.notify_all()

    def _mark_written(self, slot: int, first_uid: int, k: int, learner_iter: int) -> None:
        rows = slice(slot, slot + k)
        self._n_valid += k - int(np.count_nonzero(self._uid[rows] >= 0))
        self._uid[rows] = np.arange(first_uid, first_uid + k)
        self._use[rows] = 0
        self._insert_iter[rows] = learner_iter
        if self._sum_tree is not None:
            self._sum_tree.leaves[rows] = self._max_leaf()
        if self._min_tree is not None:
            self._overwritten_min = min(self._overwritten_min, self._min_tree.leaves[rows].min())
            self._min_tree.leaves[rows] = self._max_priority

    def _max_leaf(self) -> float:
        if not self.prioritized:
            return 1.0
        if self._kernels is None:
            return self._max_priority**self.alpha
        if self._max_leaf_of[0] != self._max_priority:  # the kernels' own leaf function (float32 pow), cached
            self._max_leaf_of = (self._max_priority, float(self._kernels.leaf_value(self._max_priority, self.alpha)))
        return self._max_leaf_of[1]

    def _check_learner_iter(self, learner_iter: int) -> None:
        if self.max_staleness is not None and learner_iter < self._last_insert_iter:
            raise ValueError(
                f"learner_iter={learner_iter} is smaller than the {self._last_insert_iter} given with earlier samples; "
                "with max_staleness set, samples must be added in learner_iter order"
            )
        self._last_insert_iter = learner_iter
        self._learner_iter = max(self._learner_iter, learner_iter)

    def _flush(self) -> None:
        """Propagate the leaves written since the last flush into the trees (batched: one pass per call)."""
        if self._pending_from == self._n_pushed:
            return
        start = max(self._pending_from, self._n_pushed - self.maxlen)
        self._pending_from = self._n_pushed
        n = self._n_pushed - start
        if n <= 0 or self._sum_tree is None:
            return
        slot = (start - self._base) % self.maxlen
        ranges = [(slot, min(slot + n, self.maxlen))]
        if slot + n > self.maxlen:
            ranges.append((0, slot + n - self.maxlen))
        for lo, hi in ranges:
            self._sum_tree.refresh(lo, hi)
            if self._min_tree is not None:
                self._min_tree.refresh(lo, hi, self._overwritten_min)
        self._overwritten_min = np.inf

    # ---- sampling --------------------------------------------------------------------------------------------
    def sample(self, batch_size: int, learner_iter: int = 0, timeout: float = 0.0) -> Optional[Batch]:
        """Draw a batch.

        Args:
            batch_size: Number of samples ``B``.
            learner_iter: The learner's iteration now; samples older than ``max_staleness`` iterations are evicted
                before drawing.
            timeout: Seconds to wait for the writer when the batch cannot be drawn yet (0: do not wait).

        Returns:
            A dict of tensors (see the module docstring), or ``None`` when fewer than ``batch_size`` samples are
            stored or the ``samples_per_insert`` limit is reached.

        Shapes:
            every field: ``(B, *field_shape)``; ``weight``, ``index``, ``unique_id``: ``(B,)``.
        """
        return self._sample(batch_size, learner_iter, timeout, remember=True)

    def _sample(self, batch_size: int, learner_iter: int, timeout: float, remember: bool) -> Optional[Batch]:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        with self._cond:
            if not self._wait_until_ready(batch_size, learner_iter, timeout):
                return None
            index, weight, uid, packed = self._draw(batch_size)
            self._n_sampled += batch_size
            self._n_sample_calls += 1
            if self.max_use is not None:
                self._evict_used(index)
            if remember:
                self._last_index, self._last_uid = index, uid
            rows = None
            if packed is not None and self._storage.direct:
                batch = self._storage.tensors_from_block(batch_size, packed)  # cheap views: fine under the lock
            else:
                rows = self._storage.gather(index, packed)
        if rows is not None:
            batch = self._storage.to_tensors(rows)  # decompression, if any, outside the lock
        batch["weight"] = torch.from_numpy(weight)
        batch["index"] = torch.from_numpy(index)
        batch["unique_id"] = torch.from_numpy(uid)
        return batch

    def _wait_until_ready(self, batch_size: int, learner_iter: int, timeout: float) -> bool:
        deadline = None
        while True:
            self._flush()
            self._learner_iter = max(self._learner_iter, learner_iter)
            if self.max_staleness is not None:
                self._evict_stale(learner_iter)
            if self._can_sample(batch_size):
                return True
            if timeout <= 0:
                return False
            now = time.monotonic()
            deadline = now + timeout if deadline is None else deadline
            if now >= deadline:
                return False
            self._waiting += 1
            try:
                self._cond.wait(deadline - now)
            finally:
                self._waiting -= 1

    def _can_sample(self, batch_size: int) -> bool:
        if self._n_valid < batch_size:
            return False
        if self.samples_per_insert is None:
            return True
        return self._n_sampled + batch_size <= self.samples_per_insert * (self._n_pushed - self._base)

    # ---- eviction --------------------------------------------------------------------------------------------
    def _evict(self, slots: np.ndarray) -> None:
        self._uid[slots] = -1
        self._n_valid -= slots.size
        if self._sum_tree is not None:
            self._sum_tree.update(slots, 0.0, unique=True)
        if self._min_tree is not None:
            self._min_tree.update(slots, np.inf, unique=True)

    def _evict_used(self, index: np.ndarray) -> None:
        used = self._use.take(index) >= self.max_use
        if used.any():
            slots = np.unique(index[used])
            self._evict(slots)
            self._evicted_use += slots.size

    def _evict_stale(self, learner_iter: int) -> None:
        threshold = learner_iter - self.max_staleness
        lo = max(self._stale_from, self._n_pushed - self.maxlen)
        self._stale_from = lo
        if lo >= self._n_pushed or self._insert_iter[(lo - self._base) % self.maxlen] >= threshold:
            return
        # insert iterations grow with the unique id, so the stale samples are the oldest ones: binary search
        ins, base, m = self._insert_iter, self._base, self.maxlen
        hi = bisect.bisect_left(range(lo, self._n_pushed), threshold, key=lambda u: ins[(u - base) % m]) + lo
        uids = np.arange(lo, hi)
        slots = (uids - base) % m
        slots = slots[self._uid.take(slots) == uids]
        if slots.size:
            self._evict(slots)
            self._evicted_stale += slots.size
        self._stale_from = hi

    # ---- priorities ------------------------------------------------------------------------------------------
    def update(
        self, priority: ArrayLike, index: Optional[ArrayLike] = None, unique_id: Optional[ArrayLike] = None
    ) -> None:
        """Set new priorities (a no-op for uniform sampling, after validating the input).

        Args:
            priority: New priorities (e.g. ``|td error|``), floored at ``eps``.
            index: Slots of the samples; without overwrite detection, so prefer ``unique_id``.
            unique_id: Unique ids of the samples (``batch['unique_id']``). A sample that was overwritten or evicted
                since it was drawn is skipped (counted in ``buffer/ignored_updates``).
            Without ``index`` and ``unique_id`` the update refers to the last batch ``sample`` returned (or, with an
            ``AsyncDataLoader``, the last batch it delivered).

        Raises:
            ValueError: a negative, NaN or infinite priority, or a length different from the batch's.

        Shapes:
            priority, index, unique_id: ``(B,)``.
        """
        p = _to_numpy(priority, np.float64)
        with self._cond:
            index, uid = self._resolve_ids(index, unique_id)
            if p.size != index.size:
                raise ValueError(f"update() got {p.size} priorities for {index.size} samples; pass one per sample")
            if p.size == 0:
                return
            if self._kernels is not None:
                self._update_compiled(index, uid, p)
                return
            p_max = p.max()
            if not (p_max < np.inf and p.min() >= 0):
                bad = p[~((p >= 0) & (p < np.inf))][:5]
                raise ValueError(f"priorities must be finite and >= 0, got {bad.tolist()}")
            if not self.prioritized:
                return
            self._flush()
            keep = self._uid.take(index) == uid
            if not keep.all():
                self._ignored_updates += int(keep.size - np.count_nonzero(keep))
                index, p = index[keep], p[keep]
                if index.size == 0:
                    return
                p_max = p.max()
            p = np.maximum(p, self.eps)
            self._max_priority = max(self._max_priority, float(p_max), self.eps)
            index, p = self._sum_tree.deduplicate(index, p)
            leaf = p if self.alpha == 1.0 else np.power(p, self.alpha)
            self._sum_tree.update(index, leaf, unique=True)
            self._min_tree.update(index, p, unique=True)

    def _update_compiled(self, index: np.ndarray, uid: np.ndarray, p: np.ndarray) -> None:
        self._flush()
        t = self._tree
        status, info, p_max = self._kernels.update_priorities(
            index, uid, p, self._uid, self.eps, self.alpha, t._sum, t._min, t._offsets, t.depth
        )
        if status < 0:
            raise ValueError(f"priorities must be finite and >= 0, got {p[info]} at position {info}")
        if info:
            self._ignored_updates += info
        if p_max > self._max_priority:
            self._max_priority = p_max
        t.note_external_update(p.size - info)

    def _resolve_ids(self, index: Optional[ArrayLike], unique_id: Optional[ArrayLike]) -> Tuple[np.ndarray, np.ndarray]:
        if unique_id is not None:
            uid = _to_numpy(unique_id, np.int64)
            return (uid - self._base) % self.maxlen, uid
        if index is not None:
            index = _to_numpy(index, np.int64)
            if index.size and (index.min() < 0 or index.max() >= self.maxlen):
                raise ValueError(f"update() index must be in [0, {self.maxlen}), got {index.min()}..{index.max()}")
            uid = self._uid.take(index)
            return index, np.where(uid < 0, -2, uid)  # -2 never matches: evicted slots stay evicted
        if self._last_index is None:
            raise ValueError("update() got no index or unique_id and no batch was sampled; pass batch['unique_id']")
        return self._last_index, self._last_uid

    def _remember(self, batch: Mapping[str, Any]) -> None:
        """Make ``batch`` the one ``update()`` without ids refers to (used by ``AsyncDataLoader``)."""
        with self._cond:
            self._last_index = _to_numpy(batch["index"], np.int64)
            self._last_uid = _to_numpy(batch["unique_id"], np.int64)

    # ---- size, monitoring, persistence -----------------------------------------------------------------------
    def __len__(self) -> int:
        return self._n_valid

    def __repr__(self) -> str:
        return f"{type(self).__name__}(size={self._n_valid}, maxlen={self.maxlen})"

    def clear(self) -> None:
        """Remove every sample and forget the fields (the next sample stored defines them anew)."""
        with self._cond:
            self._storage.clear()
            self._reset()

    def stats(self) -> Dict[str, float]:
        """Monitoring figures for the logger / TensorBoard (``buffer/...``); rates are over the time since the
        previous call. See ``monitor.buffer_stats``."""
        from .monitor import buffer_stats

        return buffer_stats(self)

    def save(self, path: str) -> None:
        """Write the contents to ``path`` (``.npz`` of plain arrays plus a JSON header; no pickle)."""
        from .persist import save_buffer

        save_buffer(self, path)

    def load(self, path: str) -> None:
        """Replace the contents with those saved at ``path`` (the buffer must have the same ``maxlen``)."""
        from .persist import load_buffer

        load_buffer(self, path)


def _check_args(
    maxlen: int,
    alpha: float,
    beta: float,
    beta_anneal_steps: int,
    eps: float,
    max_use: Optional[int],
    max_staleness: Optional[int],
    samples_per_insert: Optional[float],
) -> None:
    checks = [
        (maxlen >= 1, f"maxlen must be >= 1, got {maxlen}"),
        (alpha >= 0, f"alpha must be >= 0 (0: uniform, 1: fully proportional), got {alpha}"),
        (0 <= beta <= 1, f"beta must be in [0, 1], got {beta}"),
        (beta_anneal_steps >= 0, f"beta_anneal_steps must be >= 0 (0: no annealing), got {beta_anneal_steps}"),
        (eps > 0, f"eps (the priority floor) must be > 0, got {eps}"),
        (max_use is None or max_use >= 1, f"max_use must be None or >= 1, got {max_use}"),
        (max_staleness is None or max_staleness >= 0, f"max_staleness must be None or >= 0, got {max_staleness}"),
        (
            samples_per_insert is None or samples_per_insert > 0,
            f"samples_per_insert must be > 0, got {samples_per_insert}",
        ),
    ]
    for ok, message in checks:
        if not ok:
            raise ValueError(message)
