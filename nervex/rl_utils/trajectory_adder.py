"""``TrajectoryAdder``: the Adder interface over a tutorial-style policy's own ``_get_train_sample``."""

from __future__ import annotations

from collections import deque
from typing import Callable, Dict, List

from .adder import Transition


class TrajectoryAdder:
    """The streaming interface over a policy's own ``_get_train_sample(traj_cache)`` (nerveX's contract).

    Keeps one deque per env; hands it to ``get_train_sample`` when it holds ``traj_len`` transitions or an episode
    ends (the function pops what it consumed, as ``Adder.get_traj`` does), and once more at ``flush``; a cache whose
    episode ended, or that was flushed, is emptied afterwards.

    Args:
        get_train_sample: The policy's ``_get_train_sample``.
        traj_len: Transitions a cache holds before it is handed over (``inf``: until the episode ends).
    """

    kind = "trajectory"

    def __init__(self, get_train_sample: Callable[[deque], List[Transition]], traj_len: float) -> None:
        self._get_train_sample = get_train_sample
        self.traj_len = traj_len
        self._cache: Dict[int, deque] = {}

    def add_first(self, env_id: int) -> None:
        self._cache.pop(env_id, None)

    def reset(self) -> None:
        self._cache.clear()

    def pending(self, env_id: int) -> int:
        return len(self._cache.get(env_id, ()))

    def add(self, env_id: int, transition: Transition) -> List[Transition]:
        cache = self._cache.setdefault(env_id, deque())
        cache.append(transition)
        if not transition["done"] and len(cache) < self.traj_len:
            return []
        samples = list(self._get_train_sample(cache))
        if transition["done"]:
            cache.clear()
        return samples

    def flush(self, env_id: int) -> List[Transition]:
        cache = self._cache.pop(env_id, None)
        return list(self._get_train_sample(cache)) if cache else []


__all__ = ["TrajectoryAdder"]
