"""Deterministic envs whose every transition can be computed by hand in a test.

``ClockEnv``: obs ``[env_tag, t]`` (float32), reward ``1.0`` per step; the episode ends after ``episode_len`` steps,
as a time-limit truncation (``truncate: true``: ``truncated``, not ``terminated``) or a termination. ``info['action']``
echoes the action the env received. ``continuous: true`` gives it a Box action space ``[-1, 1]^2`` instead of
``Discrete(2)``. ``TurnEnv``: a two-seat turn-based game with masks, per-seat rewards and outcomes.
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


class TurnEnv(BaseEnv):
    """A two-seat turn-based game whose every number is known: seat ``t % 2`` moves at move ``t + 1``.

    Observation: ``{'obs': [env_tag, t] float32, 'action_mask': int8 (3,), 'to_play': t % 2}``; only action
    ``t % 3`` is legal (the env raises on any other), so a random legal action is known too. Move ``t`` (from 1)
    rewards the seats ``[t, -t]``; the last move (``episode_len``) adds the outcome ``[+1, -1]``, ``[0, 0]`` or
    ``[-1, +1]``: the winner of episode ``k`` of this env is ``winners[k % len(winners)]`` (0, 1 or -1 for a draw).
    """

    config: Dict[str, Any] = dict(env_tag=0.0, episode_len=5, winners=[0])

    def __init__(self, cfg: Optional[Dict[str, Any]] = None) -> None:
        super().__init__(dict(self.config, **(cfg or {})))
        self._t = 0
        self._episode = -1
        self._return = np.zeros(2)

    def seed(self, seed: int) -> None:
        pass

    def reset(self) -> Dict[str, Any]:
        self._t = 0
        self._episode += 1
        self._return = np.zeros(2)
        return self._obs()

    def _obs(self) -> Dict[str, Any]:
        mask = np.zeros(3, dtype=np.int8)
        mask[self._t % 3] = 1
        obs = np.array([self._cfg["env_tag"], self._t], dtype=np.float32)
        return {"obs": obs, "action_mask": mask, "to_play": self._t % 2}

    def step(self, action: Any) -> BaseEnvTimestep:
        if int(action) != self._t % 3:
            raise ValueError(f"illegal action {action} at move {self._t + 1}: only {self._t % 3} is legal")
        self._t += 1
        reward = np.array([self._t, -self._t], dtype=np.float64)
        end = self._t >= self._cfg["episode_len"]
        info: Dict[str, Any] = {"terminated": end, "truncated": False}
        if end:
            winners = self._cfg["winners"]
            winner = winners[self._episode % len(winners)]
            outcome = np.zeros(2, dtype=np.int64) if winner == -1 else np.where(np.arange(2) == winner, 1, -1)
            reward = reward + outcome
            info.update(outcome=outcome, episode_len=self._t)
        self._return = self._return + reward
        if end:
            info["episode_return"] = self._return.copy()
        return BaseEnvTimestep(self._obs(), reward, end, info)

    def info(self) -> BaseEnvInfo:
        obs_space = gym.spaces.Dict(
            {
                "obs": gym.spaces.Box(-np.inf, np.inf, (2,), np.float32),
                "action_mask": gym.spaces.Box(0, 1, (3,), np.int8),
                "to_play": gym.spaces.Discrete(2),
            }
        )
        rew_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float64)
        return BaseEnvInfo(
            2, obs_space, gym.spaces.Discrete(3), rew_space, None, agent_ids=("p0", "p1"), turn_based=True
        )

    def close(self) -> None:
        pass
