"""VMAS (Vectorized Multi-Agent Simulator) scenarios in nervex's cooperative contract, registered as ``'vmas'``.

VMAS steps a whole batch of envs as one torch call, so the fast way to run it is its own env manager
(``manager_type: vmas``, ``nervex.worker.actor.env_manager.VmasEnvManager``): one :class:`VmasBatch` of
``collector_env_num`` envs, no subprocesses. :class:`VmasEnv` is one VMAS env (a batch of one) as a plain
``BaseEnv``: the builder's probe for the spaces, and what ``manager_type: base``/``subprocess`` would step (correct,
but one torch call per env per step: much slower).

The layout (``nervex.envs.multi_agent``), per env, with ``n`` agents:

- observation ``{'obs': (n, obs_dim) float32, 'global_state': (n * obs_dim,) float32}``: VMAS has no global state,
  so ``global_state`` is the agents' observations concatenated (the fallback of the contract); rows of agents with
  smaller observations are zero-padded; no ``action_mask`` (every action is legal);
- action ``(n,)`` int64 under ``MultiDiscrete`` (``continuous_actions: false``; VMAS's flat discrete actions, 9 per
  agent in simple_spread), or ``(n, act_dim)`` float32 under a ``Box`` (``continuous_actions: true``);
- reward ``(n,)`` float32: VMAS's per-agent rewards (in ``simple_spread`` every agent gets the team's reward, so
  ``team_reward: mean``, the default, makes the team's return the scenario's return, as BenchMARL reports it);
- ``terminated`` is the scenario's ``done()``, ``truncated`` is reaching ``max_steps``.

Seeding: VMAS draws from one random state shared by every VMAS env of the process (``Environment.vmas_random_state``).
A :class:`VmasBatch` keeps its own and swaps it in around each VMAS call, so a collector and an evaluator batch in the
same process each replay their own stream: the same seed gives the same episodes, whatever else runs.
"""

from __future__ import annotations

import contextlib
import random
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import gymnasium as gym
import numpy as np
import torch

from nervex.config import Field
from nervex.utils.registry import ENV_REGISTRY

from .base_env import BaseEnv, BaseEnvInfo, BaseEnvTimestep
from .gym_env import check_env_cfg

_new_timestep = tuple.__new__
VMAS_CONFIG: Dict[str, Any] = dict(
    scenario="simple_spread",  # a module of vmas.scenarios (VMAS's own name)
    max_steps=Field(100, ge=1),  # the time limit: reaching it is a truncation
    continuous_actions=False,  # Box (n, act_dim) actions; False: MultiDiscrete (VMAS's flat discrete actions)
    scenario_kwargs={},  # keyword arguments of the scenario (simple_spread: n_agents, obs_agents)
    device="cpu",
    clamp_actions=True,  # continuous actions outside the range are clamped by VMAS (as BenchMARL runs it)
    team_reward=Field("mean", choices=("sum", "mean")),  # how the per-agent rewards make the team's
)


def _seeded_state(seed: int) -> List[Any]:
    """The (torch, numpy, python) random states after seeding each with ``seed``; the global ones are untouched."""
    saved = torch.random.get_rng_state(), np.random.get_state(), random.getstate()
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)
    state = [torch.random.get_rng_state(), np.random.get_state(), random.getstate()]
    torch.random.set_rng_state(saved[0])
    np.random.set_state(saved[1])
    random.setstate(saved[2])
    return state


def _check_cfg(cfg: Mapping[str, Any]) -> None:
    """The checks ``compile_config`` makes from ``VMAS_CONFIG``'s fields, for an env built from Python."""
    steps = cfg["max_steps"]
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"vmas config key 'max_steps' must be an int >= 1 (the episode length), got {steps!r}")
    if cfg["team_reward"] not in ("sum", "mean"):
        raise ValueError(f"vmas config key 'team_reward' must be 'sum' or 'mean', got {cfg['team_reward']!r}")
    if not isinstance(cfg["scenario_kwargs"], Mapping):
        raise TypeError(f"vmas config key 'scenario_kwargs' must be a mapping, got {cfg['scenario_kwargs']!r}")


class VmasBatch:
    """``num_envs`` envs of one VMAS scenario stepped as one torch call, as NumPy arrays with a leading env axis.

    Args:
        cfg: The env config (keys of ``VMAS_CONFIG``), already merged onto the defaults.
        num_envs: How many envs the batch holds.

    Raises:
        ValueError: a scenario whose observations are not flat tensors (dict observations), or bad config values.
    """

    def __init__(self, cfg: Mapping[str, Any], num_envs: int) -> None:
        try:
            import vmas
            from vmas.simulator.environment import Environment
        except ImportError as e:
            raise ImportError(f"env_type 'vmas' needs the vmas package: pip install -e '.[marl]' ({e})") from e
        _check_cfg(cfg)
        self._shared_state = Environment.vmas_random_state
        self._state = _seeded_state(0)  # unseeded batches are still reproducible
        self.num_envs = num_envs
        scenario = cfg["scenario"]
        self.name = f"vmas {scenario if isinstance(scenario, str) else type(scenario).__name__}"
        with self._own_stream():
            self._env = vmas.make_env(
                cfg["scenario"],
                num_envs=num_envs,
                device=cfg["device"],
                continuous_actions=bool(cfg["continuous_actions"]),
                max_steps=int(cfg["max_steps"]),
                dict_spaces=False,
                clamp_actions=bool(cfg["clamp_actions"]),
                terminated_truncated=True,
                **dict(cfg["scenario_kwargs"]),
            )
        self.agent_ids = tuple(agent.name for agent in self._env.agents)
        self.agent_num = len(self.agent_ids)
        obs_spaces = list(self._env.observation_space)
        # VMAS builds its spaces with gym or gymnasium, whichever is installed: check them by kind, not by class
        if not all(type(s).__name__ == "Box" and len(s.shape) == 1 for s in obs_spaces):
            raise ValueError(f"{self.name}: observations {obs_spaces} are not flat Boxes; only those are supported")
        self._obs_dims = [int(s.shape[0]) for s in obs_spaces]
        self.obs_dim = max(self._obs_dims)
        self.continuous = bool(cfg["continuous_actions"])
        self.act_space = self._joint_action_space(list(self._env.action_space))
        self.info = self._env_info(cfg)

    # ---- spaces ------------------------------------------------------------------------------------------------
    def _joint_action_space(self, spaces: Sequence[gym.Space]) -> gym.Space:
        if not self.continuous:
            if not all(type(s).__name__ == "Discrete" for s in spaces):
                raise ValueError(f"{self.name}: discrete action spaces {spaces} are not Discrete per agent")
            self._nvec = np.asarray([int(s.n) for s in spaces], dtype=np.int64)
            return gym.spaces.MultiDiscrete(self._nvec)
        self._act_dims = [int(s.shape[0]) for s in spaces]
        width = max(self._act_dims)
        low = np.zeros((self.agent_num, width), np.float32)
        high = np.zeros((self.agent_num, width), np.float32)  # padding columns: [0, 0], ignored by the env
        for i, s in enumerate(spaces):
            low[i, : s.shape[0]], high[i, : s.shape[0]] = s.low, s.high
        return gym.spaces.Box(low, high, dtype=np.float32)

    def _env_info(self, cfg: Mapping[str, Any]) -> BaseEnvInfo:
        n = self.agent_num
        state_space = gym.spaces.Box(-np.inf, np.inf, (n * self.obs_dim,), np.float32)
        return BaseEnvInfo(
            agent_num=n,
            obs_space=gym.spaces.Dict(
                obs=gym.spaces.Box(-np.inf, np.inf, (n, self.obs_dim), np.float32), global_state=state_space
            ),
            act_space=self.act_space,
            rew_space=gym.spaces.Box(-np.inf, np.inf, (n,), np.float32),
            max_episode_steps=int(cfg["max_steps"]),
            agent_ids=self.agent_ids,
            team_reward=cfg["team_reward"],
            state_space=state_space,
        )

    # ---- random stream -----------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _own_stream(self) -> Iterator[None]:
        """Swap this batch's random state into VMAS's process-wide one for the duration of a VMAS call."""
        shared = self._shared_state
        saved = shared[:]
        shared[:] = self._state
        try:
            yield
        finally:
            self._state[:] = shared
            shared[:] = saved

    # ---- stepping ----------------------------------------------------------------------------------------------
    def _obs_array(self, obs: List[torch.Tensor]) -> np.ndarray:
        """VMAS's per-agent ``(B, obs_dim_i)`` tensors as one ``(B, n, obs_dim)`` float32 array (zero-padded)."""
        if len(set(self._obs_dims)) > 1:
            obs = [torch.nn.functional.pad(o, (0, self.obs_dim - o.shape[1])) for o in obs]
        return torch.stack(obs, dim=1).cpu().numpy()  # .cpu(): a no-op on the CPU

    def reset(self, seed: Optional[int] = None) -> np.ndarray:
        """Reset every env (``seed``: reseed the batch's stream first). Returns ``(B, n, obs_dim)``."""
        with self._own_stream():
            return self._obs_array(self._env.reset(seed=seed))

    def reset_at(self, env_ids: Sequence[int]) -> np.ndarray:
        """Reset the envs ``env_ids`` (one VMAS ``reset_at`` each). Returns the observations of all ``(B, n, obs_dim)``."""
        with self._own_stream():
            for env_id in env_ids:
                self._env.reset_at(int(env_id), return_observations=False)
            obs = self._env.get_from_scenario(
                get_observations=True, get_rewards=False, get_infos=False, get_dones=False
            )[0]
        return self._obs_array(obs)

    def step(self, actions: np.ndarray) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Step every env with ``actions`` (``(B, n)`` int64 or ``(B, n, act_dim)`` float32, checked by
        :meth:`check_actions`).

        Returns:
            ``obs (B, n, obs_dim)`` float32, ``reward (B, n)`` float32, ``terminated (B,)`` and ``truncated (B,)`` bool.
        """
        t = torch.from_numpy(actions)
        if self.continuous:
            per_agent = [t[:, i, :d] for i, d in enumerate(self._act_dims)]
        else:
            per_agent = [t[:, i : i + 1] for i in range(self.agent_num)]
        with self._own_stream():
            obs, reward, terminated, truncated, _ = self._env.step(per_agent)
        rewards = torch.stack(reward, dim=1).cpu().numpy()
        return self._obs_array(obs), rewards, terminated.cpu().numpy(), truncated.cpu().numpy()

    def check_actions(self, actions: np.ndarray, env_ids: Sequence[int]) -> np.ndarray:
        """``actions`` (one row per env of ``env_ids``) as the dtype VMAS takes, after checking them.

        Raises:
            ValueError: a discrete action that is not an integer or is out of range, or a continuous action that is
                not finite; the message names the env and the agent.
        """
        if not self.continuous:
            if actions.dtype.kind not in "iu":
                if actions.dtype.kind != "f" or not np.array_equal(actions, np.round(actions)):
                    raise ValueError(f"{self.name}: discrete actions must be integers per agent, got {actions.dtype}")
            actions = actions.astype(np.int64, copy=False)
            bad = (actions < 0) | (actions >= self._nvec)
            if bad.any():
                row, agent = np.argwhere(bad)[0]
                raise ValueError(
                    f"{self.name}: env {env_ids[row]}'s action for agent {agent} ({self.agent_ids[agent]}) is "
                    f"{actions[row, agent]}; its actions are 0..{self._nvec[agent] - 1}"
                )
            return actions
        actions = actions.astype(np.float32, copy=False)
        finite = np.isfinite(actions).all(axis=(1, 2))
        if not finite.all():
            row = int(np.flatnonzero(~finite)[0])
            raise ValueError(f"{self.name}: env {env_ids[row]}'s continuous action is not finite: {actions[row]}")
        return actions

    def action_shape_error(self, env_id: Any, action: Any) -> ValueError:
        """The error for an action of the wrong shape, naming the env, the shape and the right one."""
        shape = np.shape(action)
        if self.continuous:
            want = f"{tuple(self.act_space.shape)} float32 (one row of {self.act_space.shape[1]} per agent)"
        else:
            want = f"({self.agent_num},) int64 (one action index per agent, MultiDiscrete {self._nvec.tolist()})"
        return ValueError(f"{self.name}: env {env_id}'s action has shape {shape}; the action space takes {want}")

    def env_obs(self, obs: np.ndarray) -> List[Dict[str, np.ndarray]]:
        """One contract observation per env: views into ``obs`` (no copy)."""
        flat = obs.reshape(obs.shape[0], -1)
        return [{"obs": o, "global_state": g} for o, g in zip(obs, flat)]

    def close(self) -> None:
        self._env = None


@ENV_REGISTRY.register("vmas")
class VmasEnv(BaseEnv):
    """One VMAS env (a batch of one) as a ``BaseEnv``; see the module docstring for the layout and the keys.

    Use ``manager_type: vmas`` to step many: it runs one batch for all of them. The VMAS env is built on first use,
    so a fresh ``VmasEnv`` is cheap to build.
    """

    config: Dict[str, Any] = VMAS_CONFIG

    def __init__(self, cfg: Optional[Mapping[str, Any]] = None) -> None:
        merged = check_env_cfg(type(self), cfg)
        merged = {k: (v.default if isinstance(v, Field) else v) for k, v in merged.items()}
        super().__init__(merged)
        self._batch: Optional[VmasBatch] = None
        self._pending_seed: Optional[int] = None
        self._return = np.zeros(0)
        self._len = 0
        self._running = False

    @property
    def batch(self) -> VmasBatch:
        if self._batch is None:
            self._batch = VmasBatch(self._cfg, 1)
        return self._batch

    def reset(self) -> Dict[str, np.ndarray]:
        seed, self._pending_seed = self._pending_seed, None
        obs = self.batch.reset(seed)
        self._return = np.zeros(self.batch.agent_num)
        self._len = 0
        self._running = True
        return self.batch.env_obs(obs)[0]

    def step(self, action: Any) -> BaseEnvTimestep:
        if not self._running:
            raise RuntimeError(f"{self.batch.name}: step before reset or after the episode ended; call reset()")
        batch = self.batch
        action = np.asarray(action)
        if action.shape != batch.act_space.shape:
            raise batch.action_shape_error(0, action)
        obs, reward, terminated, truncated = batch.step(batch.check_actions(action[None], [0]))
        self._return += reward[0]
        self._len += 1
        term, trunc = bool(terminated[0]), bool(truncated[0])
        info: Dict[str, Any] = {"terminated": term, "truncated": trunc}
        if term or trunc:
            self._running = False
            info.update(episode_return=self._return.copy(), episode_len=self._len)
        return _new_timestep(BaseEnvTimestep, (batch.env_obs(obs)[0], reward[0], term or trunc, info))

    def seed(self, seed: int) -> None:
        """Seed the next reset (VMAS reseeds its stream with it)."""
        self._pending_seed = int(seed)

    def close(self) -> None:
        if self._batch is not None:
            self._batch.close()
        self._batch = None

    def info(self) -> BaseEnvInfo:
        return self.batch.info


__all__ = ["VmasEnv", "VmasBatch", "VMAS_CONFIG"]
