"""``to_parallel_env``: a PettingZoo ``ParallelEnv`` view of any cooperative nervex env.

The way back from the cooperative layout of ``nervex.envs.multi_agent`` to PettingZoo's dicts keyed by agent, so
that PettingZoo's tools (``pettingzoo.test.parallel_api_test``, its wrappers) and its users' loops run on nervex
envs: ``parallel_api_test(to_parallel_env(PettingZooParallelEnv(cfg)))`` checks the adapter round trip.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import gymnasium as gym
import numpy as np

from .base_env import BaseEnv, BaseEnvInfo


def _parallel_env_base() -> type:
    try:
        from pettingzoo.utils.env import ParallelEnv
    except ImportError as e:
        raise ImportError("to_parallel_env needs PettingZoo: pip install 'nervex[marl]' (or 'pettingzoo')") from e
    return ParallelEnv


def _agent_spaces(info: BaseEnvInfo) -> Tuple[Dict[str, gym.Space], Dict[str, gym.Space]]:
    """Each agent's observation space (its ``obs`` row, with its ``action_mask`` where the env has masks) and action."""
    spaces = info.obs_space.spaces
    rows, act = spaces["obs"], info.act_space
    obs_spaces: Dict[str, gym.Space] = {}
    act_spaces: Dict[str, gym.Space] = {}
    for i, agent in enumerate(info.agent_ids):
        row = gym.spaces.Box(rows.low[i], rows.high[i], dtype=rows.dtype)
        if isinstance(act, gym.spaces.MultiDiscrete):
            n = int(act.nvec[i])
            act_spaces[agent] = gym.spaces.Discrete(n)
            if "action_mask" in spaces:
                row = gym.spaces.Dict(observation=row, action_mask=gym.spaces.Box(0, 1, (n,), np.int8))
        elif isinstance(act, gym.spaces.Box):
            act_spaces[agent] = gym.spaces.Box(act.low[i], act.high[i], dtype=act.dtype)
        else:
            raise TypeError(f"to_parallel_env: the env's action space {act} is neither MultiDiscrete nor Box")
        obs_spaces[agent] = row
    return obs_spaces, act_spaces


def to_parallel_env(env: BaseEnv) -> Any:
    """A PettingZoo ``ParallelEnv`` over a cooperative nervex env (dict observation with ``obs``, one row per agent).

    Agents are ``env.info().agent_ids``; an agent's observation is its ``obs`` row (``{'observation', 'action_mask'}``
    where the env has masks); ``state()`` is the ``global_state``. Agents whose ``alive`` flag drops leave
    ``agents`` (terminated); at the episode's end every agent left leaves, truncated when the nervex step says
    ``truncated``. Actions of agents absent from the dict are filled with their first legal action (the nervex env
    ignores dead agents' actions anyway).

    Raises:
        ValueError: the env is not in the cooperative layout (no ``agent_ids`` or no ``obs`` entry).
    """
    info = env.info()
    spaces = getattr(info.obs_space, "spaces", {})
    if not info.agent_ids or "obs" not in spaces or len(spaces["obs"].shape) != 2:
        raise ValueError(
            f"to_parallel_env: {env!r} is not a cooperative nervex env (it needs agent_ids and a dict observation "
            f"with an 'obs' entry of shape (agents, obs_dim))"
        )
    view_cls = type("NervexParallelEnv", (_NervexParallelEnv, _parallel_env_base()), {})
    return view_cls(env, info)


class _NervexParallelEnv:
    """The view's behaviour; ``to_parallel_env`` mixes it with PettingZoo's ``ParallelEnv`` (imported lazily)."""

    metadata = {"name": "nervex_parallel_view", "render_modes": []}

    def __init__(self, env: BaseEnv, info: BaseEnvInfo) -> None:
        self.env = env
        self._info = info
        self.possible_agents = list(info.agent_ids)
        self.agents: list = []
        self._obs_spaces, self._act_spaces = _agent_spaces(info)
        self.observation_spaces, self.action_spaces = self._obs_spaces, self._act_spaces
        self.state_space = info.obs_space.spaces.get("global_state")
        self._last: Optional[Dict[str, np.ndarray]] = None
        self.render_mode = None

    def observation_space(self, agent: str) -> gym.Space:
        return self._obs_spaces[agent]

    def action_space(self, agent: str) -> gym.Space:
        return self._act_spaces[agent]

    def reset(self, seed: Optional[int] = None, options: Optional[dict] = None) -> Tuple[dict, dict]:
        if seed is not None:
            self.env.seed(seed)
            for i, space in enumerate(self._act_spaces.values()):
                space.seed(seed + i)
        obs = self.env.reset()
        self._last = obs
        alive = obs.get("alive", np.ones(len(self.possible_agents), np.int8))
        self.agents = [a for i, a in enumerate(self.possible_agents) if alive[i]]
        return self._split(obs, self.agents), {a: {} for a in self.agents}

    def _split(self, obs: Dict[str, np.ndarray], agents: list) -> dict:
        out = {}
        for agent in agents:
            i = self.possible_agents.index(agent)
            row = obs["obs"][i]
            out[agent] = (
                {"observation": row, "action_mask": obs["action_mask"][i, : self._act_spaces[agent].n]}
                if ("action_mask" in obs)
                else row
            )
        return out

    def _joint_action(self, actions: Dict[str, Any]) -> np.ndarray:
        act = self._info.act_space
        if isinstance(act, gym.spaces.MultiDiscrete):
            mask = self._last.get("action_mask")
            first = [int(np.flatnonzero(mask[i])[0]) if mask is not None else 0 for i in range(len(act.nvec))]
            return np.asarray([actions.get(a, first[i]) for i, a in enumerate(self.possible_agents)], np.int64)
        rows = [actions.get(a, self._act_spaces[a].low) for a in self.possible_agents]
        return np.asarray(rows, np.float32)

    def step(self, actions: Dict[str, Any]) -> Tuple[dict, dict, dict, dict, dict]:
        acting = list(self.agents)
        timestep = self.env.step(self._joint_action(actions))
        obs, info = timestep.obs, timestep.info
        self._last = obs
        alive = obs.get("alive", np.ones(len(self.possible_agents), np.int8))
        index = {a: i for i, a in enumerate(self.possible_agents)}
        rewards = {a: float(timestep.reward[index[a]]) for a in acting}
        truncated = timestep.done and bool(info.get("truncated"))
        gone = {a: timestep.done or not alive[index[a]] for a in acting}
        terminations = {a: gone[a] and not truncated for a in acting}
        truncations = {a: gone[a] and truncated for a in acting}
        infos = {a: {} for a in acting}
        self.agents = [a for a in acting if not gone[a]]
        return self._split(obs, acting), rewards, terminations, truncations, infos

    def state(self) -> np.ndarray:
        if self._last is None or "global_state" not in self._last:
            raise RuntimeError("NervexParallelEnv.state(): reset first (or the env has no global_state)")
        return self._last["global_state"]

    def render(self) -> None:
        return None

    def close(self) -> None:
        self.env.close()


__all__ = ["to_parallel_env"]
