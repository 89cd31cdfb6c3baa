"""Deterministic envs whose every transition can be computed by hand in a test.

``ClockEnv``: obs ``[env_tag, t]`` (float32), reward ``1.0`` per step; the episode ends after ``episode_len`` steps,
as a time-limit truncation (``truncate: true``: ``truncated``, not ``terminated``) or a termination. ``info['action']``
echoes the action the env received. ``continuous: true`` gives it a Box action space ``[-1, 1]^2`` instead of
``Discrete(2)``. ``TurnEnv``: a two-seat turn-based game with masks, per-seat rewards and outcomes. ``AgentsEnv``:
three cooperative agents with masks, an agent that leaves early and episode stats; ``ReachEnv``: two agents with
continuous actions.
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


class AgentsEnv(BaseEnv):
    """A cooperative env of three agents ``('a', 'b', 'c')`` whose every number is known.

    Observation (before move ``t + 1``): ``{'obs': float32 (3, 2), row i = [10 * env_tag + i, t], 'global_state':
    [env_tag, t], 'action_mask': int8 (3, 3), 'alive': int8 (3,)}``: only action ``(t + i) % 3`` is legal for a
    living agent ``i`` (the env raises on any other); agent ``c`` leaves after its first move when ``leave`` (then its
    mask allows only action 0, which it must get). Move ``t`` (from 1) rewards each agent that was alive before it
    ``(i + 1) * t``. Episodes last ``episode_len`` moves, ending truncated (``truncate``) or terminated. At the end:
    ``info['episode_stats'] = {'coverage': 0.5, 'win': 1.0 on this env's even episodes, else 0.0}``; the team return
    is the ``sum`` of the agents'. With ``leave`` and 3 moves: returns a 6, b 12, c 3 (team 21).
    """

    config: Dict[str, Any] = dict(env_tag=0.0, episode_len=3, truncate=True, leave=True)
    AGENTS = ("a", "b", "c")

    def __init__(self, cfg: Optional[Dict[str, Any]] = None) -> None:
        super().__init__(dict(self.config, **(cfg or {})))
        self._t = 0
        self._episode = -1
        self._alive = np.ones(3, dtype=np.int8)
        self._return = np.zeros(3)

    def seed(self, seed: int) -> None:
        pass

    def reset(self) -> Dict[str, Any]:
        self._t, self._episode = 0, self._episode + 1
        self._alive = np.ones(3, dtype=np.int8)
        self._return = np.zeros(3)
        return self._obs()

    def _mask(self) -> np.ndarray:
        mask = np.zeros((3, 3), dtype=np.int8)
        for i in range(3):
            mask[i, (self._t + i) % 3 if self._alive[i] else 0] = 1
        return mask

    def _obs(self) -> Dict[str, Any]:
        rows = np.array([[10 * self._cfg["env_tag"] + i, self._t] for i in range(3)], dtype=np.float32)
        state = np.array([self._cfg["env_tag"], self._t], dtype=np.float32)
        return {"obs": rows, "global_state": state, "action_mask": self._mask(), "alive": self._alive.copy()}

    def step(self, action: Any) -> BaseEnvTimestep:
        action = np.asarray(action).reshape(-1)
        legal = self._mask().argmax(axis=1)
        if not np.array_equal(action, legal):
            raise ValueError(f"AgentsEnv: actions {action.tolist()} at move {self._t + 1}; legal: {legal.tolist()}")
        self._t += 1
        reward = self._alive * np.arange(1, 4) * float(self._t)
        self._return += reward
        if self._cfg["leave"]:
            self._alive[2] = 0
        end = self._t >= self._cfg["episode_len"]
        truncated = end and self._cfg["truncate"]
        info: Dict[str, Any] = {"terminated": end and not truncated, "truncated": truncated, "action": action}
        if end:
            stats = {"coverage": 0.5, "win": float(self._episode % 2 == 0)}
            info.update(episode_return=self._return.copy(), episode_len=self._t, episode_stats=stats)
        return BaseEnvTimestep(self._obs(), reward.astype(np.float32), end, info)

    def info(self) -> BaseEnvInfo:
        obs_space = gym.spaces.Dict(
            obs=gym.spaces.Box(-np.inf, np.inf, (3, 2), np.float32),
            global_state=gym.spaces.Box(-np.inf, np.inf, (2,), np.float32),
            action_mask=gym.spaces.Box(0, 1, (3, 3), np.int8),
            alive=gym.spaces.Box(0, 1, (3,), np.int8),
        )
        return BaseEnvInfo(
            3,
            obs_space,
            gym.spaces.MultiDiscrete([3, 3, 3]),
            gym.spaces.Box(-np.inf, np.inf, (3,), np.float32),
            self._cfg["episode_len"],
            agent_ids=self.AGENTS,
            team_reward="sum",
            state_space=obs_space["global_state"],
        )

    def close(self) -> None:
        pass


class ReachEnv(BaseEnv):
    """Two agents with continuous actions: agent ``i`` sees ``[target_i, t / 5]`` and earns ``-(a_i - target_i)^2``
    (targets ``[0.5, -0.5]``, actions in ``[-1, 1]``); five moves, truncated. A uniformly random action earns
    ``RANDOM_RETURN`` per agent per episode in expectation (``-5 * E[(U - target)^2] = -5 * (1/3 + 1/4)``); the best
    earns 0."""

    config: Dict[str, Any] = {}
    TARGETS = np.array([0.5, -0.5])
    RANDOM_RETURN = -5 * (1 / 3 + 0.25)

    def __init__(self, cfg: Optional[Dict[str, Any]] = None) -> None:
        super().__init__(cfg)
        self._t = 0
        self._return = np.zeros(2)

    def seed(self, seed: int) -> None:
        pass

    def reset(self) -> Dict[str, Any]:
        self._t, self._return = 0, np.zeros(2)
        return self._obs()

    def _obs(self) -> Dict[str, Any]:
        rows = np.stack([self.TARGETS, np.full(2, self._t / 5)], axis=1).astype(np.float32)
        return {"obs": rows, "global_state": rows.reshape(-1)}

    def step(self, action: Any) -> BaseEnvTimestep:
        action = np.asarray(action, dtype=np.float64).reshape(2)
        reward = -((action - self.TARGETS) ** 2)
        self._return += reward
        self._t += 1
        end = self._t >= 5
        info: Dict[str, Any] = {"terminated": False, "truncated": end}
        if end:
            info.update(episode_return=self._return.copy(), episode_len=self._t)
        return BaseEnvTimestep(self._obs(), reward.astype(np.float32), end, info)

    def info(self) -> BaseEnvInfo:
        obs_space = gym.spaces.Dict(
            obs=gym.spaces.Box(-np.inf, np.inf, (2, 2), np.float32),
            global_state=gym.spaces.Box(-np.inf, np.inf, (4,), np.float32),
        )
        return BaseEnvInfo(
            2,
            obs_space,
            gym.spaces.Box(-1.0, 1.0, (2, 1), np.float32),
            gym.spaces.Box(-np.inf, np.inf, (2,), np.float32),
            5,
            agent_ids=("left", "right"),
            team_reward="sum",
        )

    def close(self) -> None:
        pass
