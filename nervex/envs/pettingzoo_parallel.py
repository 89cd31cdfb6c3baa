"""``PettingZooParallelEnv``: any PettingZoo ``ParallelEnv`` as a cooperative nervex env (``'pettingzoo_parallel'``).

Every agent acts at every step; the nervex env speaks the cooperative layout of ``nervex.envs.multi_agent``: one
dict observation with a row per agent, one action array, one reward per agent. ``to_parallel_env`` (in
``nervex.envs.parallel_view``) goes the other way, so PettingZoo's own ``parallel_api_test`` can run on the adapter.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

import gymnasium as gym
import numpy as np

from nervex.utils.registry import ENV_REGISTRY

from .base_env import BaseEnv, BaseEnvInfo, BaseEnvTimestep
from .gym_env import check_env_cfg, check_episode_limit
from .multi_agent import TEAM_REDUCTIONS

BOX_TOLERANCE = 1e-5  # continuous actions this close outside their bounds are clipped (float32 rounding), not refused


def make_parallel_env(env_id: str, env_kwargs: Mapping[str, Any]) -> Any:
    """Build a PettingZoo ``ParallelEnv`` from ``'package.module'`` (its ``parallel_env``) or ``'module:callable'``.

    Raises:
        ValueError: ``env_id`` is not a non-empty string.
        ImportError: the module does not import (names the ``marl`` extra).
        AttributeError: the module has no such callable (names what it has that looks like one).
    """
    if not isinstance(env_id, str) or not env_id:
        raise ValueError(
            f"pettingzoo_parallel config key 'env_id' must be a module path such as 'mpe2.simple_spread_v3' or "
            f"'package.module:make_env', got {env_id!r}"
        )
    module_name, sep, attr = env_id.partition(":")
    attr = attr if sep else "parallel_env"
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ImportError(
            f"pettingzoo_parallel: cannot import '{module_name}' (config key 'env_id' = {env_id!r}): {e}. MPE and "
            f"LBF come with pip install 'nervex[marl]'"
        ) from e
    factory = getattr(module, attr, None)
    if not callable(factory):
        found = [n for n in dir(module) if "env" in n.lower() and callable(getattr(module, n))]
        raise AttributeError(
            f"pettingzoo_parallel: module '{module_name}' has no callable '{attr}' (config key 'env_id' = "
            f"{env_id!r}); name one as 'module:callable', callables with 'env' in their name: {found}"
        )
    return factory(**dict(env_kwargs))


def _import_function(spec: str) -> Callable[..., Any]:
    """The function ``'module:function'`` names (config key ``episode_stats``, from the local config file)."""
    module_name, sep, attr = str(spec).partition(":")
    fn = getattr(importlib.import_module(module_name), attr, None) if sep else None
    if not callable(fn):
        raise ValueError(
            f"pettingzoo_parallel config key 'episode_stats' must name a function as 'module:function', got {spec!r}"
        )
    return fn


def _obs_part(space: gym.Space, agent: str) -> Tuple[gym.spaces.Box, bool]:
    """The Box of an agent's own observation and whether its observations are dicts carrying ``action_mask``."""
    if isinstance(space, gym.spaces.Dict) and "observation" in space.spaces:
        own, has_mask = space["observation"], "action_mask" in space.spaces
    else:
        own, has_mask = space, False
    if not isinstance(own, gym.spaces.Box):
        raise TypeError(
            f"pettingzoo_parallel: agent {agent}'s observation space is {own}; the adapter needs a Box (or a Dict "
            f"with a Box 'observation' and an optional 'action_mask')"
        )
    return own, has_mask


def _stacked_box(boxes: List[gym.spaces.Box], width: int) -> gym.spaces.Box:
    """A ``(N, width)`` float32 Box holding each flattened box in its row, padded with zeros."""
    low, high = np.zeros((len(boxes), width), np.float32), np.zeros((len(boxes), width), np.float32)
    with np.errstate(over="ignore"):
        for i, box in enumerate(boxes):
            low[i, : box.low.size] = box.low.reshape(-1)
            high[i, : box.high.size] = box.high.reshape(-1)
    return gym.spaces.Box(low, high, dtype=np.float32)


def _joint_action_space(spaces: List[gym.Space], ids: Tuple[str, ...]) -> gym.Space:
    if all(isinstance(s, gym.spaces.Discrete) for s in spaces):
        if any(int(s.start) != 0 for s in spaces):
            raise ValueError("pettingzoo_parallel: Discrete action spaces must start at 0")
        return gym.spaces.MultiDiscrete([int(s.n) for s in spaces])
    if all(isinstance(s, gym.spaces.Box) for s in spaces):
        shape = spaces[0].shape
        if len(shape) != 1 or any(s.shape != shape for s in spaces):
            raise ValueError(
                f"pettingzoo_parallel: continuous agents need one 1-D action shape, got "
                f"{ {a: s.shape for a, s in zip(ids, spaces)} }"
            )
        low = np.stack([s.low for s in spaces]).astype(np.float32)
        high = np.stack([s.high for s in spaces]).astype(np.float32)
        return gym.spaces.Box(low, high, dtype=np.float32)
    raise TypeError(
        f"pettingzoo_parallel: the agents' action spaces must be all Discrete or all Box, got "
        f"{ {a: s for a, s in zip(ids, spaces)} }"
    )


def _env_step_limit(env: Any) -> Optional[int]:
    """The env's own episode length where it states one (MPE's ``max_cycles``, on the env or the AEC env inside)."""
    for holder in (env, getattr(env, "aec_env", None), getattr(env, "unwrapped", None)):
        limit = getattr(getattr(holder, "unwrapped", holder), "max_cycles", None) if holder is not None else None
        if isinstance(limit, int) and not isinstance(limit, bool) and limit >= 1:
            return limit
    return None


@ENV_REGISTRY.register("pettingzoo_parallel")
class PettingZooParallelEnv(BaseEnv):
    """A PettingZoo ``ParallelEnv`` in the cooperative layout; agents are ``possible_agents``, in that order.

    Config keys (``PettingZooParallelEnv.config``):

    - ``env_id``: ``'package.module'`` whose ``parallel_env(**env_kwargs)`` builds the env (``'mpe2.simple_spread_v3'``),
      or ``'package.module:callable'``.
    - ``env_kwargs``: keyword arguments of that callable (MPE: ``N``, ``max_cycles``, ``continuous_actions``...).
    - ``team_reward``: ``'sum'`` (default) or ``'mean'``, how per-agent rewards make the team's. MPE papers report
      the sum over agents (every simple_spread agent gets the shared coverage term, so the sum counts it N times).
    - ``max_episode_steps``: a step limit of the adapter's own (``None``: the env's); reaching it truncates.
    - ``episode_stats``: ``None`` or ``'module:function'``, a function of the PettingZoo env returning a dict of
      floats measured at each episode's end (``info['episode_stats']``; e.g.
      ``app_zoo.multiagent.mpe.envs:spread_coverage``).

    Observation ``{'obs': float32 (N, obs_dim), 'global_state': float32 (S,), 'action_mask': int8 (N, A)
    (discrete only), 'alive': int8 (N,)}``: each agent's observation flattened into its row, zero-padded to the widest
    (``obs_dim``). ``global_state`` is the env's ``state()`` where it declares a Box ``state_space`` (MPE does: the
    agents' observations concatenated); otherwise the fallback, the ``obs`` rows concatenated (``N * obs_dim``) --
    ``global_state_source`` says which (``'state()'`` or ``'concat_obs'``). ``action_mask`` comes from an
    ``action_mask`` entry of dict observations or from ``infos[agent]['action_mask']`` (all ones when neither);
    columns past an agent's own action count are 0.

    Actions: ``(N,)`` int64 under ``MultiDiscrete`` (every agent ``Discrete``) or ``(N, act_dim)`` float32 under a
    Box (every agent a 1-D Box of one shape). Rewards: ``(N,)`` float64, ``rew[i]`` agent ``i``'s.

    Agents that finish early (terminated, or gone from ``env.agents``) get ``alive = 0``, a zero ``obs`` row, an
    all-ones mask row and reward 0; their actions are ignored. The episode ends when no agent is left (or all are
    done); it is ``truncated`` when every agent ending at that step was truncated (the time limit), else
    ``terminated``. At a truncation the agents truncated keep ``alive = 1`` and their real last observation (their
    values bootstrap from it). ``info['agent_done']`` (bool ``(N,)``) marks who is out; when done, ``info`` has
    ``episode_return`` (``(N,)``, per agent), ``episode_len`` and, where :meth:`episode_stats` measures something,
    ``episode_stats``.

    Seeding: ``seed(s)`` makes the next reset ``reset(seed=s)`` and seeds the action space; later resets continue the
    env's random stream.
    """

    config: Dict[str, Any] = dict(
        env_id="mpe2.simple_spread_v3", env_kwargs={}, team_reward="sum", max_episode_steps=None, episode_stats=None
    )

    def __init__(self, cfg: Optional[Mapping[str, Any]] = None) -> None:
        merged = check_env_cfg(type(self), cfg)
        merged["max_episode_steps"] = check_episode_limit(type(self).__name__, merged["max_episode_steps"])
        super().__init__(merged)
        if merged["team_reward"] not in TEAM_REDUCTIONS:
            raise ValueError(
                f"{type(self).__name__} config key 'team_reward' must be one of {TEAM_REDUCTIONS}, "
                f"got {merged['team_reward']!r}"
            )
        if not isinstance(merged["env_kwargs"], Mapping):
            raise TypeError(f"{type(self).__name__} config key 'env_kwargs' must be a mapping")
        if merged["episode_stats"] is not None:
            _import_function(merged["episode_stats"])  # a misnamed function fails here, not at an episode's end
        self._env: Any = None
        self._info: Optional[BaseEnvInfo] = None
        self._ids: Tuple[str, ...] = ()
        self._agent_spaces: List[gym.Space] = []
        self._obs_sizes: List[int] = []
        self._dict_obs: List[bool] = []
        self._use_state = False
        self._all_legal = np.zeros((0, 0), np.int8)  # the mask rows of agents without one of their own
        self._last_mask: Optional[np.ndarray] = None
        self._pending_seed: Optional[int] = None
        self._running = False
        self._alive = np.zeros(0, np.int8)
        self._returns = np.zeros(0)
        self._steps = 0

    # ---- building ---------------------------------------------------------------------------------------------
    def _make(self) -> Any:
        """The PettingZoo env; subclasses that build theirs differently override this."""
        return make_parallel_env(self._cfg["env_id"], self._cfg["env_kwargs"])

    def _build(self) -> Any:
        env = self._make()
        self._ids = tuple(env.possible_agents)
        if not self._ids:
            raise ValueError(f"{self!r}: the env has no possible_agents")
        own = [_obs_part(env.observation_space(a), a) for a in self._ids]
        self._obs_sizes = [int(np.prod(box.shape)) for box, _ in own]
        self._dict_obs = [has_mask for _, has_mask in own]
        self._agent_spaces = [env.action_space(a) for a in self._ids]
        act_space = _joint_action_space(self._agent_spaces, self._ids)
        width, n = max(self._obs_sizes), len(self._ids)
        spaces: Dict[str, gym.Space] = {"obs": _stacked_box([box for box, _ in own], width)}
        state_space = getattr(env, "state_space", None)
        self._use_state = isinstance(state_space, gym.spaces.Box)
        size = int(np.prod(state_space.shape)) if self._use_state else n * width
        spaces["global_state"] = gym.spaces.Box(-np.inf, np.inf, (size,), np.float32)
        if isinstance(act_space, gym.spaces.MultiDiscrete):
            spaces["action_mask"] = gym.spaces.Box(0, 1, (n, int(act_space.nvec.max())), np.int8)
            self._all_legal = (np.arange(act_space.nvec.max()) < act_space.nvec[:, None]).astype(np.int8)
        spaces["alive"] = gym.spaces.Box(0, 1, (n,), np.int8)
        if self._pending_seed is not None:
            act_space.seed(self._pending_seed)
        self._info = BaseEnvInfo(
            agent_num=n,
            obs_space=gym.spaces.Dict(spaces),
            act_space=act_space,
            rew_space=gym.spaces.Box(-np.inf, np.inf, (n,), np.float64),
            max_episode_steps=self._cfg["max_episode_steps"] or _env_step_limit(env),
            agent_ids=self._ids,
            team_reward=self._cfg["team_reward"],
            state_space=spaces["global_state"],
        )
        self._env = env
        return env

    @property
    def global_state_source(self) -> str:
        """``'state()'`` (the env's own global state) or ``'concat_obs'`` (the fallback: the obs rows concatenated)."""
        self.info()
        return "state()" if self._use_state else "concat_obs"

    @property
    def parallel_env(self) -> Any:
        """The PettingZoo env inside (built on first use)."""
        return self._env if self._env is not None else self._build()

    # ---- observations -----------------------------------------------------------------------------------------
    def _observe(self, raw_obs: Mapping[str, Any], infos: Mapping[str, Any]) -> Dict[str, np.ndarray]:
        spaces = self._info.obs_space.spaces
        rows = np.zeros(spaces["obs"].shape, np.float32)
        mask = self._all_legal.copy() if "action_mask" in spaces else None
        for i, agent in enumerate(self._ids):
            if not self._alive[i]:
                continue
            raw = raw_obs.get(agent)
            if raw is None:
                raise KeyError(f"{self!r}: the env gave no observation for live agent {agent}")
            own = raw["observation"] if self._dict_obs[i] else raw
            rows[i, : self._obs_sizes[i]] = np.asarray(own, np.float32).reshape(-1)
            if mask is not None:
                mask[i] = self._mask_row(i, raw, infos.get(agent) or {}, mask.shape[1])
        obs: Dict[str, np.ndarray] = {"obs": rows, "global_state": self._global_state(rows)}
        if mask is not None:
            obs["action_mask"] = mask
        self._last_mask = mask
        obs["alive"] = self._alive.copy()
        return obs

    def _mask_row(self, i: int, raw: Any, info: Mapping[str, Any], width: int) -> np.ndarray:
        given = raw.get("action_mask") if self._dict_obs[i] and isinstance(raw, Mapping) else None
        if given is None:
            given = info.get("action_mask")
        n = int(self._agent_spaces[i].n)
        row = np.zeros(width, np.int8)
        if given is None:
            return self._all_legal[i]
        given = np.asarray(given).reshape(-1)  # an agent's own mask: (n,), 1 = legal
        if given.shape != (n,):
            raise ValueError(f"{self!r}: agent {self._ids[i]}'s action_mask has shape {given.shape}, expected ({n},)")
        row[:n] = given != 0
        if not row.any():
            raise ValueError(f"{self!r}: agent {self._ids[i]}'s action_mask allows no action")
        return row

    def _global_state(self, rows: np.ndarray) -> np.ndarray:
        if self._use_state:
            return np.asarray(self._env.state(), np.float32).reshape(-1)
        return rows.reshape(-1).copy()

    # ---- the contract -----------------------------------------------------------------------------------------
    def seed(self, seed: int) -> None:
        """Make the next ``reset`` call the env's ``reset(seed=seed)`` and seed the action space."""
        self._pending_seed = int(seed)
        if self._info is not None:
            self._info.act_space.seed(self._pending_seed)

    def reset(self) -> Dict[str, np.ndarray]:
        """Start an episode; return the first observation (agents absent at the start are not alive)."""
        env = self.parallel_env
        raw_obs, infos = env.reset(seed=self._pending_seed)
        self._pending_seed = None
        self._running, self._steps = True, 0
        self._returns = np.zeros(len(self._ids))
        self._alive = np.asarray([a in env.agents for a in self._ids], np.int8)
        return self._observe(raw_obs, infos or {})

    def step(self, action: Any) -> BaseEnvTimestep:
        """Act for every live agent; see the class docstring for what comes back.

        Raises:
            RuntimeError: no ``reset`` since construction or the last ``done``.
            ValueError: an action of the wrong shape, outside its agent's space or forbidden by its mask (names the
                agent and what would be legal).
        """
        if not self._running:
            raise RuntimeError(f"{self!r}: step() before reset(); reset the env first and after every done step")
        env = self._env
        actions = self._agent_actions(action)
        raw_obs, rewards, terms, truncs, infos = env.step(actions)
        reward = np.asarray([float(rewards.get(a, 0.0)) if self._alive[i] else 0.0 for i, a in enumerate(self._ids)])
        self._returns += reward
        self._steps += 1
        was_alive = self._alive.astype(bool)
        ended_term = was_alive & np.asarray([bool(terms.get(a, False)) for a in self._ids])
        ended_trunc = was_alive & ~ended_term & np.asarray([bool(truncs.get(a, False)) for a in self._ids])
        present = np.asarray([a in env.agents for a in self._ids])
        still = was_alive & ~ended_term & ~ended_trunc & present
        limit = self._cfg["max_episode_steps"]
        over = not still.any() or (limit is not None and self._steps >= limit)
        terminated = bool(over and ended_term.any())
        truncated = bool(over and not terminated)
        # agents truncated at the episode's end keep their real last observation: their values bootstrap from it
        kept = ended_trunc & np.asarray([a in raw_obs for a in self._ids]) if truncated else False
        self._alive = (still | kept).astype(np.int8)
        obs = self._observe(raw_obs, infos or {})
        info: Dict[str, Any] = {"terminated": terminated, "truncated": truncated, "agent_done": ~still}
        if over:
            self._running = False
            info.update(episode_return=self._returns.copy(), episode_len=self._steps)
            stats = self.episode_stats()
            if stats:
                info["episode_stats"] = stats
        return BaseEnvTimestep(obs, reward, over, info)

    def _agent_actions(self, action: Any) -> Dict[str, Any]:
        space = self._info.act_space
        if isinstance(space, gym.spaces.MultiDiscrete):
            return self._discrete_actions(action, space)
        array = np.asarray(action, np.float32)
        if array.shape != space.shape:
            raise ValueError(f"{self!r}: the action must be shaped {space.shape} (agents, act_dim), got {array.shape}")
        out: Dict[str, Any] = {}
        for i, agent in enumerate(self._ids):
            if not self._alive[i]:
                continue
            row, low, high = array[i], space.low[i], space.high[i]
            if not np.isfinite(row).all() or (row < low - BOX_TOLERANCE).any() or (row > high + BOX_TOLERANCE).any():
                raise ValueError(
                    f"{self!r}: agent {agent}'s action {row.tolist()} is outside its space "
                    f"[{low.tolist()}, {high.tolist()}]"
                )
            out[agent] = np.clip(row, low, high).astype(self._agent_spaces[i].dtype)
        return out

    def _discrete_actions(self, action: Any, space: gym.spaces.MultiDiscrete) -> Dict[str, Any]:
        array = np.asarray(action)
        if array.shape != space.shape or array.dtype.kind not in "iu":
            raise ValueError(
                f"{self!r}: the action must be an int array shaped {space.shape} (one per agent), got "
                f"{array.dtype} {array.shape}"
            )
        out: Dict[str, Any] = {}
        last_mask = self._last_mask
        for i, agent in enumerate(self._ids):
            if not self._alive[i]:
                continue
            index, n = int(array[i]), int(space.nvec[i])
            if not 0 <= index < n:
                raise ValueError(f"{self!r}: agent {agent}'s action {index} is outside Discrete({n})")
            if last_mask is not None and not last_mask[i, index]:
                legal = np.flatnonzero(last_mask[i]).tolist()
                raise ValueError(f"{self!r}: agent {agent}'s action {index} is masked; legal: {legal}")
            out[agent] = index
        return out

    def episode_stats(self) -> Dict[str, float]:
        """Per-episode figures measured at the episode's end (``info['episode_stats']``): the config's function's."""
        spec = self._cfg["episode_stats"]
        if spec is None:
            return {}
        stats = _import_function(spec)(self._env)
        if not isinstance(stats, Mapping) or not all(isinstance(k, str) for k in stats):
            raise TypeError(f"{self!r}: episode_stats function {spec!r} must return a dict of str -> float")
        return {k: float(v) for k, v in stats.items()}

    def info(self) -> BaseEnvInfo:
        """Spaces, ``agent_ids`` (``possible_agents``), a per-agent ``rew_space``, ``team_reward`` and ``state_space``."""
        if self._info is None:
            self._build()
        return self._info

    def close(self) -> None:
        """Close the env; safe to call twice. A later ``reset`` builds a new one."""
        env, self._env = self._env, None
        self._running = False
        if env is not None:
            env.close()

    def __getstate__(self) -> Dict[str, Any]:
        state = self.__dict__.copy()
        state.update(_env=None, _info=None, _running=False)
        return state

    def __repr__(self) -> str:
        return f"{type(self).__name__}(env_id={self._cfg['env_id']!r})"


def callable_env_id(factory: Callable[..., Any]) -> str:
    """The ``env_id`` naming a module-level factory: ``'package.module:name'``."""
    return f"{factory.__module__}:{factory.__qualname__}"


__all__ = ["PettingZooParallelEnv", "make_parallel_env", "callable_env_id"]
