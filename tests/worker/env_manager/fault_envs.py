"""Small deterministic envs for the env manager tests, importable by spawned children (module level classes).

``CountingEnv``: obs ``[env_tag, t]`` (float32), reward ``1.0`` per step, terminates after ``episode_len`` steps.
Its ``fault`` config key makes it misbehave at step ``fault_step`` of every episode (counting from 1) -- or, for
``'raise_prob'``, with probability ``fault_prob`` per step from its own seeded stream:

- ``'raise'`` / ``'raise_prob'``: raise ``ValueError('boom ...')`` from ``step``;
- ``'reset_request'``: raise ``EnvResetRequest``;
- ``'exit'``: ``os._exit(3)``; ``'segv'``: SIGSEGV to itself; ``'hang'``: sleep ``hang_s`` seconds;
- ``'reset_raise'``: raise from every ``reset`` after the first ``fault_step`` ones (``0``: from every reset).
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any, Dict, Optional

import gymnasium as gym
import numpy as np

from nervex.envs import BaseEnv, BaseEnvInfo, BaseEnvTimestep, EnvResetRequest

DEFAULTS: Dict[str, Any] = dict(
    env_tag=0.0, episode_len=3, fault=None, fault_step=2, fault_prob=0.0, hang_s=30.0, delay_s=0.0
)


class CountingEnv(BaseEnv):
    config = DEFAULTS

    def __init__(self, cfg: Optional[Dict[str, Any]] = None) -> None:
        super().__init__(dict(DEFAULTS, **(cfg or {})))
        self._t = 0
        self._resets = 0
        self._rng = np.random.default_rng(12345)
        self.seeds = []

    def seed(self, seed: int) -> None:
        self.seeds.append(seed)

    def reset(self) -> np.ndarray:
        self._resets += 1
        if self._cfg["fault"] == "reset_raise" and self._resets > self._cfg["fault_step"]:
            raise RuntimeError("reset failed on purpose")
        self._t = 0
        return self._obs()

    def _obs(self) -> np.ndarray:
        return np.array([self._cfg["env_tag"], self._t], dtype=np.float32)

    def _misbehave(self) -> None:
        fault = self._cfg["fault"]
        if fault == "raise_prob":
            if self._rng.random() < self._cfg["fault_prob"]:
                raise ValueError(f"boom at t={self._t}")
            return
        if fault is None or self._t != self._cfg["fault_step"]:
            return
        if fault == "raise":
            raise ValueError(f"boom at t={self._t}")
        if fault == "reset_request":
            raise EnvResetRequest(f"please reset at t={self._t}")
        if fault == "exit":
            os._exit(3)
        if fault == "segv":
            os.kill(os.getpid(), signal.SIGSEGV)
        if fault == "hang":
            time.sleep(self._cfg["hang_s"])

    def step(self, action: Any) -> BaseEnvTimestep:
        if self._cfg["delay_s"]:
            time.sleep(self._cfg["delay_s"])
        self._t += 1
        self._misbehave()
        done = self._t >= self._cfg["episode_len"]
        info: Dict[str, Any] = {"terminated": done, "truncated": False, "action": int(action)}
        if done:
            info.update(episode_return=float(self._t), episode_len=self._t)
        return BaseEnvTimestep(self._obs(), 1.0, done, info)

    def info(self) -> BaseEnvInfo:
        space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
        return BaseEnvInfo(1, space, gym.spaces.Discrete(2), None, None)

    def close(self) -> None:
        pass


class ImageEnv(CountingEnv):
    """CountingEnv with Atari-sized uint8 frames: every pixel is ``(env_tag + t) % 256``."""

    SHAPE = (4, 84, 84)

    def _obs(self) -> np.ndarray:
        return np.full(self.SHAPE, (int(self._cfg["env_tag"]) + self._t) % 256, dtype=np.uint8)

    def info(self) -> BaseEnvInfo:
        return BaseEnvInfo(1, gym.spaces.Box(0, 255, self.SHAPE, np.uint8), gym.spaces.Discrete(2), None, None)
