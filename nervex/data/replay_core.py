"""``BaseBuffer``: the replay buffer that ``PrioritizedBuffer`` and ``ReplayBuffer`` configure (see ``buffer.py``).

Samples live in a ``ColumnStorage`` (one preallocated array per field) used as a ring of ``maxlen`` slots: the
``k``-th sample ever stored gets ``unique_id = k`` and lives in slot ``k % maxlen`` (shifted by ``clear`` and ``load``)
until it is overwritten or evicted. Priorities live in a ``PriorityTree`` (its sums for sampling, its minimum for the
importance weights); a uniform buffer has a tree only once evictions can leave holes in the ring. The buffer owns the
storage, the tree and the per-slot bookkeeping (unique id, use count, insert iteration), and is the only writer of all.

Sampling returns a dict of torch tensors: every sample field stacked on dim 0 (nested dicts kept nested), plus
``weight`` (importance-sampling weights, ``float32``), ``index`` (slots) and ``unique_id`` (both ``int64``). It
returns ``None`` when fewer than ``batch_size`` samples are stored or when the ``samples_per_insert`` rate limit
would be exceeded (``timeout`` makes it wait for the writer instead). Priority updates name samples by unique id, so
an update for a sample overwritten or evicted since it was drawn is skipped.

Threads: one writer (``append``/``extend``) and one reader (``sample``/``update``) may run at the same time; one lock
guards the bookkeeping, and conversion, compression and decompression happen outside it.
"""

from __future__ import annotations

import bisect
import threading
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

import numpy as np
import torch

from .persist import read_replay_file, write_replay_file
from .replay_args import check_replay_args
from .storage import ColumnStorage
from .tree import PriorityTree

ArrayLike = Union[np.ndarray, torch.Tensor, Sequence[float]]
Batch = Dict[str, Any]
# saved with the contents (persist.py); the names are the file's keys
_COUNTERS = (
    "n_pushed",
    "base",
    "stale_from",
    "n_valid",
    "n_sampled",
    "n_sample_calls",
    "max_priority",
    "evicted_use",
    "evicted_stale",
    "ignored_updates",
    "last_insert_iter",
    "learner_iter",
)


def _to_numpy(x: Any, dtype: type) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        try:
            x = x.numpy()
        except (RuntimeError, TypeError):  # a tensor on a GPU, or one that requires grad
            x = x.detach().cpu().numpy()
    if type(x) is np.ndarray and x.dtype == dtype and x.ndim == 1 and x.flags.c_contiguous:
        return x
    return np.ascontiguousarray(np.asarray(x, dtype=dtype).reshape(-1))


class BaseBuffer:
    """The replay buffer (use ``PrioritizedBuffer`` or ``ReplayBuffer``, which document the arguments)."""

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
        check_replay_args(maxlen, alpha, beta, beta_anneal_steps, eps, max_use, max_staleness, samples_per_insert)
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
        self._cond = threading.Condition(threading.Lock())
        self._rng = np.random.default_rng(seed)
        self._tree: Optional[PriorityTree] = None
        if self.prioritized or self.max_use is not None or self.max_staleness is not None:
            # the tree's draws have their own generator, seeded from the buffer's so a seeded buffer repeats itself
            tree_seed = int(self._rng.integers(0, 2**63))
            self._tree = PriorityTree(self.maxlen, self.alpha if self.prioritized else 1.0, tree_seed)
        self._n_pushed = 0  # unique ids handed out so far; never reset, so ids stay unique across clear()/load()
        self._reset()

    def _reset(self) -> None:
        self._base = self._n_pushed  # unique id that goes to slot 0
        self._stale_from = self._n_pushed
        self._n_valid = self._n_sampled = self._n_sample_calls = 0
        self._max_priority = 1.0
        self._evicted_use = self._evicted_stale = self._ignored_updates = 0
        self._last_insert_iter = self._learner_iter = 0
        self._waiting = 0
        self._stats_time, self._stats_pushed, self._stats_sampled = time.monotonic(), self._n_pushed, 0
        self._uid.fill(-1)
        self._use.fill(0)
        self._insert_iter.fill(0)
        if self._tree is not None:
            self._tree.clear()

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
            if self._tree is not None:
                self._tree.fill(slot, slot + 1, self._max_priority)
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
                rows = slice(slot, slot + k)
                self._n_valid += k - int(np.count_nonzero(self._uid[rows] >= 0))
                self._uid[rows] = np.arange(uid, uid + k)
                self._use[rows] = 0
                self._insert_iter[rows] = learner_iter
                if self._tree is not None:
                    self._tree.fill(slot, slot + k, self._max_priority)
                pos += k
            self._n_pushed += n
            if self._waiting:
                self._cond.notify_all()

    def _check_learner_iter(self, learner_iter: int) -> None:
        if self.max_staleness is not None and learner_iter < self._last_insert_iter:
            raise ValueError(
                f"learner_iter={learner_iter} is smaller than the {self._last_insert_iter} given with earlier samples; "
                "with max_staleness set, samples must be added in learner_iter order"
            )
        self._last_insert_iter = learner_iter
        self._learner_iter = max(self._learner_iter, learner_iter)

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
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        with self._cond:
            if not self._wait_until_ready(batch_size, learner_iter, timeout):
                return None
            filled = min(self._n_pushed - self._base, self.maxlen)
            if self._tree is None or (not self.prioritized and self._n_valid == filled):
                index = self._rng.integers(0, filled, batch_size)
                np.add.at(self._use, index, 1)
                weight, uid, block = np.ones(batch_size, dtype=np.float32), self._uid.take(index), None
            else:
                beta = self.current_beta() if self.prioritized else 0.0
                index, weight, uid, block = self._tree.draw(
                    batch_size, beta, self._uid, self._use, self._storage.packed_plan
                )
            self._n_sampled += batch_size
            self._n_sample_calls += 1
            if self.max_use is not None:
                self._evict_used(index)
            rows = None
            if block is not None and self._storage.direct:
                batch = self._storage.tensors_from_block(batch_size, block)  # cheap views: fine under the lock
            else:
                rows = self._storage.gather(index, block)
        if rows is not None:
            batch = self._storage.to_tensors(rows)  # decompression, if any, outside the lock
        batch["weight"] = torch.from_numpy(weight)
        batch["index"] = torch.from_numpy(index)
        batch["unique_id"] = torch.from_numpy(uid)
        return batch

    def _wait_until_ready(self, batch_size: int, learner_iter: int, timeout: float) -> bool:
        deadline = None
        while True:
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

    def current_beta(self) -> float:
        """Importance-sampling exponent now: ``beta`` annealed linearly to 1 over ``beta_anneal_steps`` samples."""
        if self.beta_anneal_steps <= 0:
            return self.beta
        progress = min(1.0, self._n_sample_calls / self.beta_anneal_steps)
        return self.beta + (1.0 - self.beta) * progress

    # ---- eviction --------------------------------------------------------------------------------------------
    def _evict(self, slots: np.ndarray) -> None:
        self._uid[slots] = -1
        self._n_valid -= slots.size
        self._tree.remove(slots)

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
    def update(self, priority: ArrayLike, unique_id: ArrayLike) -> None:
        """Set new priorities of the samples of a batch (a no-op for uniform sampling, after validating the input).

        Args:
            priority: New priorities (e.g. ``|td error|``), floored at ``eps``.
            unique_id: The samples' unique ids (``batch['unique_id']``). A sample overwritten or evicted since it was
                drawn is skipped (counted in ``buffer/ignored_updates``).

        Raises:
            ValueError: a negative, NaN or infinite priority, or not one priority per unique id.

        Shapes:
            priority, unique_id: ``(B,)``.
        """
        p = _to_numpy(priority, np.float64)
        uid = _to_numpy(unique_id, np.int64)
        if p.size != uid.size:
            raise ValueError(f"update() got {p.size} priorities for {uid.size} unique ids; pass one per sample")
        if not self.prioritized:
            invalid = ~((p >= 0) & (p < np.inf))
            if invalid.any():
                i = int(np.argmax(invalid))
                raise ValueError(f"priorities must be finite and >= 0, got {p[i]} at position {i}")
            return
        with self._cond:
            ignored, p_max = self._tree.update(uid, p, self._uid, self._base, self.eps)
            self._ignored_updates += ignored
            self._max_priority = max(self._max_priority, p_max)

    def priority(self, unique_id: ArrayLike) -> np.ndarray:
        """The current priorities of samples (1 in a uniform buffer), NaN for those no longer stored.

        Shapes:
            unique_id: ``(n,)``; returns ``(n,)`` ``float64``.
        """
        uid = _to_numpy(unique_id, np.int64)
        with self._cond:
            slot = (uid - self._base) % self.maxlen
            priority = self._tree.priorities[slot] if self.prioritized else np.ones(uid.size)
            return np.where(self._uid[slot] == uid, priority, np.nan)

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
        """Monitoring figures for the logger and TensorBoard; rates are over the time since the previous call.

        Returns:
            ``buffer/size``, ``buffer/pushes_per_s``, ``buffer/samples_per_s`` (transitions drawn per second),
            ``buffer/pushed``, ``buffer/sampled``, ``buffer/samples_per_insert``, ``buffer/mean_use``,
            ``buffer/mean_staleness`` (learner iterations), ``buffer/evicted_by_use``,
            ``buffer/evicted_by_staleness``, ``buffer/ignored_updates``, ``buffer/memory_mb``; with compressed fields
            ``buffer/compression_ratio``; when prioritized ``buffer/priority_mean|max|min`` and ``buffer/beta``.
        """
        with self._cond:
            now = time.monotonic()
            elapsed = max(now - self._stats_time, 1e-9)
            pushed = self._n_pushed - self._base
            filled = min(pushed, self.maxlen)
            valid = self._uid[:filled] >= 0
            out = {
                "buffer/size": float(self._n_valid),
                "buffer/pushes_per_s": (self._n_pushed - self._stats_pushed) / elapsed,
                "buffer/samples_per_s": (self._n_sampled - self._stats_sampled) / elapsed,
                "buffer/pushed": float(pushed),
                "buffer/sampled": float(self._n_sampled),
                "buffer/samples_per_insert": self._n_sampled / max(1, pushed),
                "buffer/mean_use": _masked_mean(self._use[:filled], valid),
                "buffer/mean_staleness": self._learner_iter - _masked_mean(self._insert_iter[:filled], valid),
                "buffer/evicted_by_use": float(self._evicted_use),
                "buffer/evicted_by_staleness": float(self._evicted_stale),
                "buffer/ignored_updates": float(self._ignored_updates),
                "buffer/memory_mb": self._storage.memory(filled)["stored"] / 2**20,
            }
            if self._storage.compress_fields:
                out["buffer/compression_ratio"] = self._storage.compression_ratio(filled)
            if self.prioritized:
                priority = self._tree.priorities[:filled][valid]
                out["buffer/priority_mean"] = float(priority.mean()) if priority.size else 0.0
                out["buffer/priority_max"] = float(priority.max()) if priority.size else 0.0
                out["buffer/priority_min"] = float(priority.min()) if priority.size else 0.0
                out["buffer/beta"] = self.current_beta()
            self._stats_time, self._stats_pushed, self._stats_sampled = now, self._n_pushed, self._n_sampled
            return out

    def save(self, path: str) -> None:
        """Write the contents to ``path`` (``.npz`` of plain arrays plus a JSON header, see ``persist``; no pickle)."""
        with self._cond:
            filled = min(self._n_pushed - self._base, self.maxlen)
            header = {
                "kind": type(self).__name__,
                "maxlen": self.maxlen,
                "prioritized": self.prioritized,
                "alpha": self.alpha,
                "filled": filled,
                "schema": self._storage.schema() if self._storage.ready else None,
                "counters": {name: _plain(getattr(self, f"_{name}")) for name in _COUNTERS},
            }
            arrays = {"uid": self._uid[:filled], "use": self._use[:filled], "insert_iter": self._insert_iter[:filled]}
            if self.prioritized:
                arrays["priority"] = self._tree.priorities[:filled]
            if self._storage.ready:
                arrays.update(self._storage.state_arrays(filled))
            write_replay_file(path, header, arrays)

    def load(self, path: str) -> None:
        """Replace the contents with those saved at ``path``.

        Priorities are kept when both the saved and the loading buffer are prioritized; a uniform save loaded into a
        prioritized buffer gives every sample priority 1. Unique ids are shifted past those this buffer already
        issued, so a priority update for a batch drawn before ``load`` can never touch a loaded sample.

        Raises:
            ValueError: not a nervex replay file, a newer format, a different ``maxlen``, or compressed fields that
                differ.
        """
        header, arrays = read_replay_file(path)
        if header["maxlen"] != self.maxlen:
            raise ValueError(
                f"{path} was saved from a buffer with maxlen={header['maxlen']}; this one has maxlen={self.maxlen}. "
                f"Create the buffer with maxlen={header['maxlen']} to load it"
            )
        filled = int(header["filled"])
        with self._cond:
            self._storage.clear()
            self._reset()
            if header["schema"] is not None:
                self._storage.init_from_description(header["schema"])
                self._storage.load_state_arrays(arrays, filled)
            shift = self._n_pushed  # ids issued by this buffer before the load stay unused
            for name in _COUNTERS:
                setattr(self, f"_{name}", header["counters"][name])
            self._n_pushed += shift
            self._base += shift
            self._stale_from += shift
            self._stats_pushed = self._n_pushed
            uid = arrays["uid"]
            self._uid[:filled] = np.where(uid >= 0, uid + shift, -1)
            self._use[:filled] = arrays["use"]
            self._insert_iter[:filled] = arrays["insert_iter"]
            if self._tree is not None:
                valid = self._uid[:filled] >= 0
                if not (self.prioritized and header["prioritized"]):
                    priority, self._max_priority = np.ones(filled), 1.0
                else:
                    priority = arrays["priority"]
                self._tree.fill(0, filled, np.where(valid, priority, np.inf))


def _masked_mean(values: np.ndarray, mask: np.ndarray) -> float:
    n = int(np.count_nonzero(mask))
    return float(values[mask].sum() / n) if n else 0.0


def _plain(value: Any) -> Any:
    return value.item() if hasattr(value, "item") else value
