"""The two-step game of the QMIX paper (Rashid et al. 2018, section 6.1), registered as ``'two_step_game'``.

Two agents, two actions each, two steps. In the first state agent 1's action picks the branch (action 0: 2A,
action 1: 2B; agent 2's action does not matter) and the team earns 0. In 2A the team earns 7 whatever the agents do;
in 2B it earns ``[[0, 1], [1, 8]][a1][a2]``. The optimum is 2B then (1, 1): 8. VDN's sum of per-agent values cannot
represent the payoff of 2B and settles on 2A (7); QMIX's monotonic mixing conditioned on the state can (8).

It is nervex's smallest cooperative env and the example of the simultaneous-move, many-agent contract
(``nervex.envs.multi_agent``): dict observations with per-agent ``obs``, an ``action_mask`` per agent, the
``global_state``; a ``MultiDiscrete`` action (one entry per agent); a reward per agent (every agent gets the team's
reward, so ``team_reward: mean`` makes the team return the paper's payoff).
"""

from __future__ import annotations

from typing import Any, Dict, Optional

import gymnasium as gym
import numpy as np

from nervex.utils.registry import ENV_REGISTRY

from .base_env import BaseEnv, BaseEnvInfo, BaseEnvTimestep

PAYOFF_2B = np.array([[0.0, 1.0], [1.0, 8.0]])
PAYOFF_2A = 7.0
AGENTS = ("agent_0", "agent_1")
STATE_NUM = 3  # 1, 2A, 2B


@ENV_REGISTRY.register("two_step_game")
class TwoStepGameEnv(BaseEnv):
    """The QMIX paper's two-step game.

    Observation: ``{'obs': float32 (2, 3), 'global_state': float32 (3,), 'action_mask': int8 (2, 2)}``: every agent
    sees the one-hot of the state (1, 2A, 2B), which is also the global state; every action is legal. Reward per
    agent: the team's payoff, ``(2,)``. Episodes last two steps and end ``terminated``.
    """

    config: Dict[str, Any] = {}

    def __init__(self, cfg: Optional[Dict[str, Any]] = None) -> None:
        super().__init__(cfg)
        self._state = 0
        self._steps = 0
        self._return = 0.0
        space = gym.spaces.Box(0.0, 1.0, (STATE_NUM,), np.float32)
        self._info = BaseEnvInfo(
            agent_num=2,
            obs_space=gym.spaces.Dict(
                obs=gym.spaces.Box(0.0, 1.0, (2, STATE_NUM), np.float32),
                global_state=space,
                action_mask=gym.spaces.Box(0, 1, (2, 2), np.int8),
            ),
            act_space=gym.spaces.MultiDiscrete([2, 2]),
            rew_space=gym.spaces.Box(-np.inf, np.inf, (2,), np.float32),
            max_episode_steps=2,
            agent_ids=AGENTS,
            team_reward="mean",
            state_space=space,
        )

    def _obs(self) -> Dict[str, np.ndarray]:
        state = np.zeros(STATE_NUM, np.float32)
        state[self._state] = 1.0
        return {"obs": np.stack([state, state]), "global_state": state, "action_mask": np.ones((2, 2), np.int8)}

    def reset(self) -> Dict[str, np.ndarray]:
        self._state, self._steps, self._return = 0, 0, 0.0
        return self._obs()

    def step(self, action: Any) -> BaseEnvTimestep:
        action = np.asarray(action, dtype=np.int64).reshape(-1)
        if action.shape != (2,) or not np.isin(action, (0, 1)).all():
            raise ValueError(f"two_step_game: the action must be one of 0 or 1 per agent, shaped (2,), got {action}")
        if self._steps >= 2:
            raise RuntimeError("two_step_game: step after the episode ended; call reset()")
        if self._state == 0:
            reward = 0.0
            self._state = 1 if action[0] == 0 else 2
        else:
            reward = PAYOFF_2A if self._state == 1 else float(PAYOFF_2B[action[0], action[1]])
        self._steps += 1
        self._return += reward
        done = self._steps == 2
        info: Dict[str, Any] = {"terminated": done, "truncated": False}
        if done:
            info.update(episode_return=np.full(2, self._return), episode_len=2)
        return BaseEnvTimestep(self._obs(), np.full(2, reward, dtype=np.float32), done, info)

    def seed(self, seed: int) -> None:
        """The game is deterministic; nothing to seed."""

    def close(self) -> None:
        """Nothing to release."""

    def info(self) -> BaseEnvInfo:
        return self._info


__all__ = ["TwoStepGameEnv", "PAYOFF_2A", "PAYOFF_2B"]
