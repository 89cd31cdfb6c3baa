"""Replay buffers, offline datasets and batch loading.

* ``PrioritizedBuffer`` / ``ReplayBuffer``: columnar replay with vectorized sum/min trees (``SumTree``, ``MinTree``).
* ``TrajectoryWriter`` / ``OfflineDataset`` / ``OfflineDataLoader``: offline RL data on disk and its loading.
* ``AsyncDataLoader``: background prefetching from a buffer or dataset.
* ``collate``: lists of nested dicts of arrays -> batched tensors.
"""

from .async_loader import AsyncDataLoader
from .buffer import BUFFER_REGISTRY, BaseBuffer, PrioritizedBuffer, ReplayBuffer
from .collate import collate
from .offline import OfflineDataLoader, OfflineDataset, TrajectoryWriter
from .tree import MinTree, SumTree

__all__ = [
    "PrioritizedBuffer",
    "BUFFER_REGISTRY",
    "ReplayBuffer",
    "BaseBuffer",
    "AsyncDataLoader",
    "OfflineDataset",
    "OfflineDataLoader",
    "TrajectoryWriter",
    "collate",
    "SumTree",
    "MinTree",
]
