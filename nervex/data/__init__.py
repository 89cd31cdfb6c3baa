"""Replay buffers, offline datasets and batch loading.

* ``PrioritizedBuffer`` / ``ReplayBuffer``: columnar replay with an 8-ary sum/min tree (``PriorityTree``);
  ``sequence_priority`` for sequences (R2D2).
* ``TrajectoryWriter`` / ``OfflineDataset`` / ``OfflineDataLoader``: offline RL data on disk and its loading.
* ``AsyncDataLoader``: background prefetching from a buffer or dataset.
* ``collate``: lists of nested dicts of arrays -> batched tensors.
"""

from .async_loader import AsyncDataLoader
from .buffer import BUFFER_REGISTRY, BaseBuffer, PrioritizedBuffer, ReplayBuffer
from .collate import collate
from .offline import OfflineDataLoader, OfflineDataset, TrajectoryWriter
from .priority import sequence_priority
from .tree import PriorityTree

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
    "PriorityTree",
    "sequence_priority",
]
