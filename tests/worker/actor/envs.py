"""Deterministic envs whose every transition can be computed by hand in a test.

``ClockEnv``: obs ``[env_tag, t]`` (float32), reward ``1.0`` per step; the episode ends after ``episode_len`` steps,
as a time-limit truncation (``truncate: true``: ``truncated``, not ``terminated``) or a termination. ``info['action']``
echoes the action the env received. ``continuous: true`` gives it a Box action space ``[-1, 1]^2`` instead of
``Discrete(2)``.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

import gymnasium as gym
import numpy as np

from nervex.envs import BaseEnv, BaseEnvInfo, BaseEnvTimestep


class ClockEnv(BaseEnv):
    config: Dict[str, Any] = dict(env_tag=0.0, episode_len=3, truncate=False, continuous=False)

    def __init__(self, cfg: Optional[Dict[str, Any]] = None) -> None:
        super().__init__(dict(self.config, **(cfg or {})))
        self._t = 0

    def seed(self, seed: int) -> None:
        pass

    def reset(self) -> np.ndarray:
        self._t = 0
        return self._obs()

    def _obs(self) -> np.ndarray:
        return np.array([self._cfg["env_tag"], self._t], dtype=np.float32)

    def step(self, action: Any) -> BaseEnvTimestep:
        self._t += 1
        end = self._t >= self._cfg["episode_len"]
        truncated = end and self._cfg["truncate"]
        info: Dict[str, Any] = {"terminated": end and not truncated, "truncated": truncated, "action": action}
        if end:
            info.update(episode_return=float(self._t), episode_len=self._t)
        return BaseEnvTimestep(self._obs(), 1.0, end, info)

    def info(self) -> BaseEnvInfo:
        obs_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
        if self._cfg["continuous"]:
            act_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        else:
            act_space = gym.spaces.Discrete(2)
        return BaseEnvInfo(1, obs_space, act_space, None, None)

    def close(self) -> None:
        pass
