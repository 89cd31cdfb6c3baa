"""The environment contract every nervex env follows."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Dict, NamedTuple, Optional, Tuple, Union

import gymnasium as gym
import numpy as np


class BaseEnvTimestep(NamedTuple):
    """What ``BaseEnv.step`` returns.

    ``done`` is ``terminated or truncated``; ``info['terminated']`` and ``info['truncated']`` keep the two apart
    (only ``terminated`` may cut bootstrapping). When ``done``, ``info`` also carries ``episode_return`` and
    ``episode_len``, and ``obs`` is the real last observation of the episode (the env is not reset here).

    Many agents: ``reward`` is a float ndarray shaped like ``BaseEnvInfo.rew_space`` (one entry per agent, ordered
    as ``agent_ids``; ``nervex.envs.agent_array`` turns a dict keyed by agent id into it); ``done`` stays the
    episode's; ``info['agent_done']`` (optional) is a bool array per agent; ``info['episode_return']`` is then an
    array per agent (``nervex.envs.team_value`` reduces it as ``team_reward`` says). Games add ``info['outcome']``,
    an int array per seat: +1 win, 0 draw, -1 loss.
    """

    obs: Any
    reward: Union[float, np.ndarray]
    done: bool
    info: Dict[str, Any]


class BaseEnvInfo(NamedTuple):
    """Static description of an env: Gymnasium spaces, the agents and how their rewards make the team's.

    The defaults describe one agent, so a single-agent env sets only the first fields.

    Attributes:
        agent_num: Number of agents (seats); ``len(agent_ids)`` when ``agent_ids`` is given.
        obs_space: Observation space; a ``gym.spaces.Dict`` with keys ``obs``, ``action_mask`` (1 = legal),
            ``global_state`` (optional) and ``to_play`` (turn-based only) for masked or multi-agent envs.
        act_space: Action space (of the acting seat for turn-based envs; ``MultiDiscrete`` per agent otherwise).
        rew_space: Declared reward shape: ``None`` or shape ``()`` = a scalar float, ``(agent_num,)`` = per agent.
        max_episode_steps: The time limit, if any.
        agent_ids: The agents/seats in order; empty = one agent.
        team_reward: ``'sum'`` or ``'mean'``: how per-agent rewards and returns reduce to the team's.
        turn_based: One seat acts per step; the observation's ``to_play`` says which.
        state_space: The global state's space, when the env has one.
    """

    agent_num: int
    obs_space: gym.Space
    act_space: gym.Space
    rew_space: Optional[gym.Space] = None
    max_episode_steps: Optional[int] = None
    agent_ids: Tuple[str, ...] = ()
    team_reward: str = "sum"
    turn_based: bool = False
    state_space: Optional[gym.Space] = None


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
