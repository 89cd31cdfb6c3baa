"""Independent learners: each agent of a simultaneous-move env is a trajectory of its own for a single-agent policy.

A learning slot with ``independent: true`` (``actor.slots.main: {kind: learn, seats: all, independent: true}``)
splits every step of a cooperative env (``nervex.envs.multi_agent``) by agent. The policy sees agent ``i``'s row as
if it were an env of its own, keyed ``env_id * agent_num + i`` (as the seats of a turn-based env are):

- observation: ``{'obs': obs['obs'][i], 'action_mask': obs['action_mask'][i]}`` when the env masks actions, else the
  plain row ``obs['obs'][i]`` (``agent_obs: row`` gives the plain row always, for a policy that takes no mask);
- action: the agent's output goes into the joint action (``(N,)`` int64 or ``(N, act_dim)``); an agent that is not
  alive (``obs['alive'][i] == 0``) does not act and gets an idle action (its first legal one, or zeros);
- reward: the agent's own ``reward[i]`` (``agent_reward: own``) or the team's (``agent_reward: team``: the env's
  ``team_reward`` reduction);
- done: the episode's ``terminated``/``truncated``; an agent that leaves the episode early (``alive`` drops to 0, or
  ``info['agent_done'][i]``) ends its trajectory there as terminated.

One set of weights acts for every agent: parameter sharing. No policy changes: the policy's Adder keeps one
trajectory per key. ``collect.n_sample`` still counts env steps (each yields one transition per alive agent).
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Tuple

import gymnasium as gym
import numpy as np

from nervex.config import ConfigError
from nervex.envs import BaseEnvTimestep, team_value

from .turns import Decision

Output = Dict[str, Any]
AGENT_REWARDS = ("own", "team")
AGENT_OBS = ("auto", "row")


def agent_spaces(act_space: gym.Space, agent_num: int, where: str = "") -> Tuple[gym.Space, ...]:
    """Each agent's own action space: ``Discrete(nvec[i])`` of a per-agent ``MultiDiscrete``, the row ``i`` of a
    ``Box`` shaped ``(agent_num, ...)``.

    Raises:
        ConfigError: any other joint action space (named, with the two that split).
    """
    if isinstance(act_space, gym.spaces.MultiDiscrete) and act_space.nvec.shape == (agent_num,):
        return tuple(gym.spaces.Discrete(int(n), start=int(s)) for n, s in zip(act_space.nvec, act_space.start))
    if isinstance(act_space, gym.spaces.Box) and act_space.shape[:1] == (agent_num,):
        return tuple(
            gym.spaces.Box(act_space.low[i], act_space.high[i], dtype=act_space.dtype) for i in range(agent_num)
        )
    raise ConfigError(
        f"independent learners{where} need a joint action with one entry per agent: MultiDiscrete([A] * {agent_num}) "
        f"or Box(({agent_num}, act_dim)); the env's action space is {act_space}"
    )


def _first_axis(space: gym.Space) -> Optional[int]:
    if isinstance(space, gym.spaces.Dict):
        space = space.spaces.get("obs")
    shape = getattr(space, "shape", None)
    return int(shape[0]) if shape else None


class AgentSplit:
    """How one env step splits into one trajectory per agent, and how the agents' actions join.

    Args:
        env_info: The env's ``BaseEnvInfo``: ``agent_num`` > 1, simultaneous moves, observations stacked by agent.
        agent_reward: ``'own'`` (``reward[i]``) or ``'team'`` (the env's ``team_reward`` reduction of ``reward``).
        agent_obs: ``'auto'`` (a dict with the agent's ``action_mask`` when the env masks actions) or ``'row'``.
        where: The slot's dotted key, for error messages.

    Raises:
        ConfigError: a turn-based or one-agent env, observations not stacked by agent, a joint action that does not
            split (``agent_spaces``), an unknown ``agent_reward``/``agent_obs``.
    """

    def __init__(self, env_info: Any, agent_reward: str = "own", agent_obs: str = "auto", where: str = "") -> None:
        n = int(env_info.agent_num)
        if env_info.turn_based or n < 2:
            kind = (
                "turn-based (its seats already are trajectories of their own)" if env_info.turn_based else "one agent"
            )
            raise ConfigError(
                f"key '{where}.independent': independent learners need a simultaneous-move env of several agents; "
                f"this env is {kind}: drop the key"
            )
        if _first_axis(env_info.obs_space) != n:
            raise ConfigError(
                f"key '{where}.independent': the env's observations are not stacked by agent ({env_info.obs_space}); "
                f"independent learners need 'obs' shaped ({n}, obs_dim)"
            )
        if agent_reward not in AGENT_REWARDS or agent_obs not in AGENT_OBS:
            raise ConfigError(
                f"key '{where}': agent_reward must be one of {AGENT_REWARDS}, agent_obs one of {AGENT_OBS}"
            )
        self.agent_num = n
        self.spaces = agent_spaces(env_info.act_space, n, f" (key '{where}.independent')")
        self.discrete = isinstance(env_info.act_space, gym.spaces.MultiDiscrete)
        self.agent_ids = tuple(env_info.agent_ids) or tuple(str(i) for i in range(n))
        self.reward_mode = agent_reward
        self.obs_mode = agent_obs
        self.team_reward = env_info.team_reward
        self._where = where

    def describe(self) -> str:
        return f"independent learners: one trajectory per agent (agent_reward: {self.reward_mode}, agent_obs: {self.obs_mode})"

    # ---- observations ------------------------------------------------------------------------------------------
    def alive(self, obs: Any) -> np.ndarray:
        """Which agents are in the episode: ``obs['alive']`` (absent: all)."""
        if isinstance(obs, Mapping) and "alive" in obs:
            return np.asarray(obs["alive"]).reshape(-1).astype(bool)
        return np.ones(self.agent_num, dtype=bool)

    def agent_obs(self, obs: Any, i: int) -> Any:
        """What agent ``i``'s policy sees (see the module docstring)."""
        if not isinstance(obs, Mapping):
            return obs[i]
        row = obs["obs"][i]
        if self.obs_mode == "auto" and "action_mask" in obs:
            return {"obs": row, "action_mask": obs["action_mask"][i]}
        return row

    # ---- actions -----------------------------------------------------------------------------------------------
    def join(self, obs: Any, outputs: Mapping[int, Output]) -> Output:
        """The joint action of the agents' outputs (``{agent index: output}``; idle actions for the rest), with the
        outputs kept as ``'agents'`` for the transitions.

        Raises:
            ValueError: an agent's action is one its ``action_mask`` forbids (named).
        """
        mask = np.asarray(obs["action_mask"]) if isinstance(obs, Mapping) and "action_mask" in obs else None
        actions = []
        for i, space in enumerate(self.spaces):
            if i not in outputs:
                actions.append(self._idle_action(space, None if mask is None else mask[i]))
                continue
            action = outputs[i]["action"]
            if self.discrete and mask is not None and not mask[i][int(action) - int(space.start)]:
                raise ValueError(
                    f"{self._where}: agent {self.agent_ids[i]!r} took action {int(action)}, which its action_mask "
                    f"{mask[i].tolist()} forbids; give the policy the mask ({self._where}.agent_obs: auto and a "
                    "policy that takes dict observations with 'action_mask', like dqn)"
                )
            actions.append(action)
        if self.discrete:
            joint = np.asarray(actions, dtype=np.int64).reshape(self.agent_num)
        else:
            joint = np.stack([np.asarray(a, dtype=np.float32) for a in actions])
        return {"action": joint, "agents": dict(outputs)}

    @staticmethod
    def _idle_action(space: gym.Space, mask: Optional[np.ndarray]) -> Any:
        if isinstance(space, gym.spaces.Discrete):
            legal = np.flatnonzero(mask[: int(space.n)]) if mask is not None else np.zeros(1, dtype=np.int64)
            return np.int64(int(space.start) + int(legal[0] if legal.size else 0))
        return np.clip(np.zeros(space.shape, dtype=np.float32), space.low, space.high)

    # ---- transitions -------------------------------------------------------------------------------------------
    def rewards(self, reward: Any) -> np.ndarray:
        """One step's reward per agent, as ``agent_reward`` says.

        Raises:
            ValueError: the env's reward is not one value per agent.
        """
        rewards = np.asarray(reward, dtype=np.float64).reshape(-1)
        if rewards.shape != (self.agent_num,):
            raise ValueError(
                f"{self._where}: independent learners need one reward per agent ({self.agent_num}), got shape "
                f"{np.shape(reward)}"
            )
        if self.reward_mode == "team":
            return np.full(self.agent_num, team_value(rewards, self.team_reward))
        return rewards

    def timesteps(self, obs: Any, output: Output, timestep: BaseEnvTimestep) -> List[Decision]:
        """The agents' decisions one env step completes: ``[(agent, obs seen, agent output, agent timestep)]`` for
        every agent that acted, with its reward, its next observation and its own end (see the module docstring)."""
        rewards = self.rewards(timestep.reward)
        info = timestep.info
        left = ~self.alive(timestep.obs)
        if info.get("agent_done") is not None:
            left |= np.asarray(info["agent_done"], dtype=bool).reshape(-1)
        episode = {"terminated": bool(info.get("terminated", timestep.done)), "truncated": bool(info.get("truncated"))}
        decisions: List[Decision] = []
        for i, agent_output in output["agents"].items():
            if timestep.done:
                done, flags = True, episode
            elif left[i]:
                done, flags = True, {"terminated": True, "truncated": False}
            else:
                done, flags = False, {"terminated": False, "truncated": False}
            agent_step = BaseEnvTimestep(self.agent_obs(timestep.obs, i), float(rewards[i]), done, flags)
            decisions.append((i, self.agent_obs(obs, i), agent_output, agent_step))
        return decisions


__all__ = ["AGENT_REWARDS", "AGENT_OBS", "AgentSplit", "agent_spaces"]
