"""A tiny continuous cooperative env for the ATOC tests: agents on a line, each steering to its own target."""

from typing import Any, Dict, Optional

import gymnasium as gym
import numpy as np

from nervex.envs import BaseEnv, BaseEnvInfo, BaseEnvTimestep
from nervex.utils import ENV_REGISTRY

STEP = 0.25  # the largest move per step


class LineTargetsEnv(BaseEnv):
    """``agent_num`` agents at ``x_i`` in ``[-1, 1]``, targets ``t_i`` drawn at reset. Agent ``i`` sees ``[x_i, t_i -
    x_i]``, moves by ``STEP * a_i`` (``a_i`` in ``[-1, 1]``) and earns ``-|t_i - x_i|`` after its move; episodes are
    truncated after ``time_limit`` steps. A policy that steers straight to its target earns about -1.3 per agent in
    10 steps; acting at random about -6."""

    config = dict(agent_num=3, time_limit=10)

    def __init__(self, cfg: Optional[Dict[str, Any]] = None) -> None:
        super().__init__(cfg)
        cfg = cfg or {}
        self.agent_num = int(cfg.get("agent_num", 3))
        self.time_limit = int(cfg.get("time_limit", 10))
        self._rng = np.random.default_rng(0)
        self._x = np.zeros(self.agent_num)
        self._target = np.zeros(self.agent_num)
        self._t = 0
        self._return = np.zeros(self.agent_num)

    def _obs(self) -> Dict[str, np.ndarray]:
        rows = np.stack([self._x, self._target - self._x], axis=1).astype(np.float32)
        return {"obs": rows, "global_state": rows.reshape(-1)}

    def reset(self) -> Dict[str, np.ndarray]:
        self._x = self._rng.uniform(-1, 1, self.agent_num)
        self._target = self._rng.uniform(-1, 1, self.agent_num)
        self._t, self._return = 0, np.zeros(self.agent_num)
        return self._obs()

    def step(self, action: Any) -> BaseEnvTimestep:
        move = np.clip(np.asarray(action, dtype=np.float64).reshape(self.agent_num), -1, 1) * STEP
        self._x = np.clip(self._x + move, -1, 1)
        reward = -np.abs(self._target - self._x)
        self._t += 1
        self._return += reward
        truncated = self._t >= self.time_limit
        info: Dict[str, Any] = {"terminated": False, "truncated": truncated}
        if truncated:
            info.update(episode_return=self._return.copy(), episode_len=self._t)
        return BaseEnvTimestep(self._obs(), reward.astype(np.float32), truncated, info)

    def seed(self, seed: int) -> None:
        self._rng = np.random.default_rng(seed)

    def close(self) -> None:
        pass

    def info(self) -> BaseEnvInfo:
        n = self.agent_num
        return BaseEnvInfo(
            agent_num=n,
            obs_space=gym.spaces.Dict(
                obs=gym.spaces.Box(-2.0, 2.0, (n, 2), np.float32),
                global_state=gym.spaces.Box(-2.0, 2.0, (2 * n,), np.float32),
            ),
            act_space=gym.spaces.Box(-1.0, 1.0, (n, 1), np.float32),
            rew_space=gym.spaces.Box(-np.inf, np.inf, (n,), np.float32),
            max_episode_steps=self.time_limit,
            agent_ids=tuple(f"agent_{i}" for i in range(n)),
            team_reward="sum",
            state_space=gym.spaces.Box(-2.0, 2.0, (2 * n,), np.float32),
        )


ENV_REGISTRY.register("test_line_targets", LineTargetsEnv, force=True)
