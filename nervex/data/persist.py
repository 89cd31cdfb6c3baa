"""Saving and loading a replay buffer's contents, so that a resumed run keeps its replay.

Format: one ``.npz`` (``np.savez``, read back with ``allow_pickle=False``) holding plain arrays — each column's filled
rows (compressed columns as one byte blob plus per-row sizes), the slot bookkeeping (``uid``, ``use``,
``insert_iter``, ``priority``) — and ``header``, the UTF-8 bytes of a JSON object with the schema and counters.
Nothing in the file is unpickled or evaluated.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any, Dict

import numpy as np

if TYPE_CHECKING:
    from .replay_core import BaseBuffer

FORMAT = "nervex.replay"
FORMAT_VERSION = 1
_COUNTERS = (
    "_n_pushed",
    "_base",
    "_stale_from",
    "_n_valid",
    "_n_sampled",
    "_n_sample_calls",
    "_max_priority",
    "_evicted_use",
    "_evicted_stale",
    "_ignored_updates",
    "_last_insert_iter",
    "_learner_iter",
)


def save_buffer(buffer: BaseBuffer, path: str) -> None:
    """Write ``buffer``'s contents to ``path`` atomically (a temporary file renamed into place)."""
    with buffer._cond:
        buffer._flush()
        filled = min(buffer._n_pushed - buffer._base, buffer.maxlen)
        header: Dict[str, Any] = {
            "format": FORMAT,
            "version": FORMAT_VERSION,
            "kind": type(buffer).__name__,
            "maxlen": buffer.maxlen,
            "prioritized": buffer.prioritized,
            "alpha": buffer.alpha,
            "filled": filled,
            "schema": buffer._storage.schema() if buffer._storage.ready else None,
            "counters": {name.lstrip("_"): _plain(getattr(buffer, name)) for name in _COUNTERS},
        }
        arrays = {
            "header": np.frombuffer(json.dumps(header).encode("utf-8"), dtype=np.uint8),
            "uid": buffer._uid[:filled],
            "use": buffer._use[:filled],
            "insert_iter": buffer._insert_iter[:filled],
        }
        if buffer._min_tree is not None:
            arrays["priority"] = buffer._min_tree.leaves[:filled]
        if buffer._storage.ready:
            arrays.update(buffer._storage.state_arrays(filled))
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)
    os.replace(tmp, path)


def load_buffer(buffer: BaseBuffer, path: str) -> None:
    """Replace ``buffer``'s contents with those saved at ``path``.

    Priorities are kept when both the saved and the loading buffer are prioritized; a uniform save loaded into a
    prioritized buffer gives every sample priority 1. Unique ids are shifted past those this buffer already issued,
    so a priority update for a batch drawn before ``load`` can never touch a loaded sample.

    Raises:
        ValueError: not a nervex replay file, a newer format, a different ``maxlen``, or compressed fields that differ.
    """
    with np.load(path, allow_pickle=False) as f:
        header = _read_header(f, path)
        if header["maxlen"] != buffer.maxlen:
            raise ValueError(
                f"{path} was saved from a buffer with maxlen={header['maxlen']}; this one has maxlen={buffer.maxlen}. "
                f"Create the buffer with maxlen={header['maxlen']} to load it"
            )
        filled = int(header["filled"])
        arrays = {k: f[k] for k in f.files if k != "header"}
    with buffer._cond:
        buffer._storage.clear()
        buffer._reset()
        if header["schema"] is not None:
            buffer._storage.init_from_description(header["schema"])
            buffer._storage.load_state_arrays(arrays, filled)
        shift = buffer._n_pushed  # ids issued by this buffer before the load stay unused
        counters = header["counters"]
        for name in _COUNTERS:
            setattr(buffer, name, counters[name.lstrip("_")])
        for name in ("_n_pushed", "_base", "_stale_from"):
            setattr(buffer, name, getattr(buffer, name) + shift)
        buffer._pending_from = buffer._n_pushed
        buffer._stats_pushed = buffer._n_pushed
        uid = arrays["uid"]
        buffer._uid[:filled] = np.where(uid >= 0, uid + shift, -1)
        buffer._use[:filled] = arrays["use"]
        buffer._insert_iter[:filled] = arrays["insert_iter"]
        _restore_priorities(buffer, arrays, filled, header["prioritized"])


def _restore_priorities(
    buffer: BaseBuffer, arrays: Dict[str, np.ndarray], filled: int, saved_prioritized: bool
) -> None:
    valid = buffer._uid[:filled] >= 0
    if buffer._sum_tree is None:
        return
    if buffer.prioritized:
        if saved_prioritized:
            priority = np.where(valid, arrays["priority"], 1.0)
        else:
            priority, buffer._max_priority = np.ones(filled), 1.0
        buffer._sum_tree.leaves[:filled] = np.where(valid, priority**buffer.alpha, 0.0)
        buffer._min_tree.leaves[:filled] = np.where(valid, priority, np.inf)
        buffer._min_tree.rebuild()
    else:
        buffer._sum_tree.leaves[:filled] = valid
    buffer._sum_tree.rebuild()


def _read_header(f: Any, path: str) -> Dict[str, Any]:
    if "header" not in f.files:
        raise ValueError(f"{path} is not a nervex replay buffer file (no header)")
    header = json.loads(f["header"].tobytes().decode("utf-8"))
    if header.get("format") != FORMAT:
        raise ValueError(f"{path} is not a nervex replay buffer file (format {header.get('format')!r})")
    if header.get("version", 0) > FORMAT_VERSION:
        raise ValueError(
            f"{path} has replay format version {header['version']}; this nervex reads up to {FORMAT_VERSION}"
        )
    return header


def _plain(value: Any) -> Any:
    return value.item() if hasattr(value, "item") else value
