"""Monitoring figures of a replay buffer, for the text log and TensorBoard (``buffer/...`` scalars)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Dict

import numpy as np

if TYPE_CHECKING:
    from .replay_core import BaseBuffer


def buffer_stats(buffer: BaseBuffer) -> Dict[str, float]:
    """Monitoring figures of ``buffer`` for the logger and TensorBoard; rates are over the time since the previous
    call. Keys: ``buffer/size``, ``buffer/pushes_per_s``, ``buffer/samples_per_s`` (transitions drawn per second),
    ``buffer/mean_use``, ``buffer/mean_staleness`` (learner iterations), ``buffer/priority_mean|max|min``, ``buffer/memory_mb``, ``buffer/compression_ratio``...
    """
    with buffer._cond:
        buffer._flush()
        now = time.monotonic()
        elapsed = max(now - buffer._stats_time, 1e-9)
        filled = min(buffer._n_pushed - buffer._base, buffer.maxlen)
        valid = buffer._uid[:filled] >= 0
        out = {
            "buffer/size": float(buffer._n_valid),
            "buffer/pushes_per_s": (buffer._n_pushed - buffer._stats_pushed) / elapsed,
            "buffer/samples_per_s": (buffer._n_sampled - buffer._stats_sampled) / elapsed,
            "buffer/pushed": float(buffer._n_pushed - buffer._base),
            "buffer/sampled": float(buffer._n_sampled),
            "buffer/samples_per_insert": buffer._n_sampled / max(1, buffer._n_pushed - buffer._base),
            "buffer/mean_use": _masked_mean(buffer._use[:filled], valid),
            "buffer/mean_staleness": buffer._learner_iter - _masked_mean(buffer._insert_iter[:filled], valid),
            "buffer/evicted_by_use": float(buffer._evicted_use),
            "buffer/evicted_by_staleness": float(buffer._evicted_stale),
            "buffer/ignored_updates": float(buffer._ignored_updates),
            "buffer/memory_mb": buffer._storage.memory(filled)["stored"] / 2**20,
        }
        if buffer._storage.compress_fields:
            out["buffer/compression_ratio"] = buffer._storage.compression_ratio(filled)
        if buffer.prioritized:
            prio = buffer._min_tree.leaves[:filled][valid]
            out["buffer/priority_mean"] = float(prio.mean()) if prio.size else 0.0
            out["buffer/priority_max"] = float(prio.max()) if prio.size else 0.0
            out["buffer/priority_min"] = float(prio.min()) if prio.size else 0.0
            out["buffer/beta"] = buffer.current_beta()
        buffer._stats_time, buffer._stats_pushed, buffer._stats_sampled = now, buffer._n_pushed, buffer._n_sampled
        return out


def _masked_mean(values: np.ndarray, mask: np.ndarray) -> float:
    n = int(np.count_nonzero(mask))
    return float(values[mask].sum() / n) if n else 0.0
