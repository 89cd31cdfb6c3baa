"""The environment contract every nervex env follows."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Dict, NamedTuple, Optional

import gymnasium as gym


class BaseEnvTimestep(NamedTuple):
    """What ``BaseEnv.step`` returns.

    ``done`` is ``terminated or truncated``; ``info['terminated']`` and ``info['truncated']`` keep the two apart
    (only ``terminated`` may cut bootstrapping). When ``done``, ``info`` also carries ``episode_return`` and
    ``episode_len``, and ``obs`` is the real last observation of the episode (the env is not reset here).
    """

    obs: Any
    reward: float
    done: bool
    info: Dict[str, Any]


class BaseEnvInfo(NamedTuple):
    """Static description of an env: Gymnasium spaces plus the agent count."""

    agent_num: int
    obs_space: gym.Space
    act_space: gym.Space
    rew_space: Optional[gym.Space] = None
    max_episode_steps: Optional[int] = None


class BaseEnv(ABC):
    """Base class of nervex environments.

    Subclasses declare their defaults in the class attribute ``config`` (a nested dict); ``compile_config`` merges
    the user's ``env`` section onto it, and the constructor receives the merged mapping.

    Seeding: ``seed(s)`` makes the *next* ``reset`` use seed ``s`` (and seeds the action space); later resets
    continue the same random stream, so a run is reproducible from one seed.
    """

    config: Dict[str, Any] = {}

    def __init__(self, cfg: Optional[Dict[str, Any]] = None) -> None:
        self._cfg = cfg or {}

    @abstractmethod
    def reset(self) -> Any:
        """Start a new episode and return its first observation."""

    @abstractmethod
    def step(self, action: Any) -> BaseEnvTimestep:
        """Advance one step."""

    @abstractmethod
    def seed(self, seed: int) -> None:
        """Seed the next reset and the action space."""

    @abstractmethod
    def close(self) -> None:
        """Release resources; safe to call twice."""

    @abstractmethod
    def info(self) -> BaseEnvInfo:
        """Describe the spaces."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({dict(self._cfg)!r})"


class EnvResetRequest(Exception):
    """Raised by an env's ``step`` to ask its manager for a plain reset (the episode is dropped, not a crash)."""
