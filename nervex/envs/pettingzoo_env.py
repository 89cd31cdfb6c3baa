"""``PettingZooAECEnv``: a turn-based PettingZoo (AEC) game as a nervex env (registered as ``'pettingzoo_aec'``).

One nervex step is one move: the seat ``to_play`` acts, the game advances to the next seat that must decide. The
observation is that seat's own view, as a dict (see :class:`PettingZooAECEnv`); the reward is an array of every
seat's reward for this move, ordered as ``info().agent_ids``.
"""

from __future__ import annotations

import difflib
import re
from typing import Any, Dict, List, Mapping, Optional, Tuple

import gymnasium as gym
import numpy as np

from nervex.utils.registry import ENV_REGISTRY

from .base_env import BaseEnv, BaseEnvInfo, BaseEnvTimestep
from .gym_env import check_env_cfg, check_episode_limit

_LEGACY_ID = re.compile(r"^([a-z0-9_]+)_v(\d+)$")  # 'tictactoe_v3', the name of PettingZoo's module


def make_aec_env(env_id: str, env_kwargs: Mapping[str, Any]) -> Any:
    """Build a PettingZoo AEC env from its registry id (``'classic/tictactoe-v3'``) or module name (``'tictactoe_v3'``).

    Raises:
        ImportError: PettingZoo is not installed (names the extra to install).
        KeyError: an unknown id; names the closest registered one.
    """
    try:
        import pettingzoo
    except ImportError as e:
        raise ImportError(
            "env_type 'pettingzoo_aec' needs PettingZoo: pip install 'nervex[games]' (or 'pettingzoo[classic]')"
        ) from e
    ids = list(pettingzoo.aec_registry.keys())
    match = _LEGACY_ID.match(env_id)
    if env_id not in ids and match:
        suffix = f"/{match.group(1)}-v{match.group(2)}"
        env_id = next((i for i in ids if i.endswith(suffix)), env_id)
    if env_id not in ids:
        close = difflib.get_close_matches(env_id, ids, n=1, cutoff=0.4)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise KeyError(f"unknown PettingZoo AEC env id '{env_id}' (config key 'env_id'){hint} registered: {ids}")
    return pettingzoo.make("aec", env_id, **dict(env_kwargs))


def as_int_action(action: Any) -> int:
    try:
        return int(action.item())  # NumPy scalars, 0-d or 1-element arrays, torch tensors
    except AttributeError:
        return int(action)


@ENV_REGISTRY.register("pettingzoo_aec")
class PettingZooAECEnv(BaseEnv):
    """A turn-based PettingZoo game; every seat uses the same observation and action spaces.

    Config keys (``PettingZooAECEnv.config``):

    - ``env_id``: a PettingZoo AEC registry id (``'classic/tictactoe-v3'``) or module name (``'tictactoe_v3'``).
    - ``env_kwargs``: keyword arguments for ``pettingzoo.make``.
    - ``flatten_obs``: observations as a 1-D ``float32`` vector (an MLP's input) instead of the env's own shape
      and dtype.
    - ``max_episode_steps``: a move limit (``None``: the game's own end); reaching it truncates.

    Observation: ``{'obs': the acting seat's view, 'action_mask': int8 (A,) (1 = legal; all ones when the game
    gives none), 'to_play': np.int64 seat index}``. An action the mask forbids raises ``ValueError`` (the game's own
    rule for illegal moves never runs). When done, ``info`` has ``episode_return`` (per seat), ``episode_len``
    (moves) and ``outcome`` (per seat: the sign of its return, +1 win, 0 draw, -1 loss); ``obs`` is the final
    position seen by the seat that would move next. Seeding: ``seed(s)`` seeds the next reset and the action
    space; later resets continue the game's random stream.
    """

    config: Dict[str, Any] = dict(
        env_id="classic/tictactoe-v3", env_kwargs={}, flatten_obs=True, max_episode_steps=None
    )

    def __init__(self, cfg: Optional[Mapping[str, Any]] = None) -> None:
        merged = check_env_cfg(type(self), cfg)
        merged["max_episode_steps"] = check_episode_limit(type(self).__name__, merged["max_episode_steps"])
        super().__init__(merged)
        self._env: Any = None
        self._info: Optional[BaseEnvInfo] = None
        self._ids: Tuple[str, ...] = ()
        self._pending_seed: Optional[int] = None
        self._running = False
        self._returns = np.zeros(0)
        self._moves = 0

    # ---- building ---------------------------------------------------------------------------------------------
    def _build(self) -> Any:
        env = make_aec_env(self._cfg["env_id"], self._cfg["env_kwargs"])
        self._ids = tuple(env.possible_agents)
        act_space = env.action_space(self._ids[0])
        raw_obs_space = env.observation_space(self._ids[0])
        for agent in self._ids[1:]:
            if env.action_space(agent) != act_space or env.observation_space(agent) != raw_obs_space:
                raise ValueError(
                    f"{self!r}: seats differ in their spaces ({agent} vs {self._ids[0]}); the adapter needs one "
                    f"observation and action space for every seat"
                )
        if self._pending_seed is not None:
            act_space.seed(self._pending_seed)
        self._info = BaseEnvInfo(
            agent_num=len(self._ids),
            obs_space=self._obs_space(raw_obs_space, act_space),
            act_space=act_space,
            rew_space=gym.spaces.Box(-np.inf, np.inf, (len(self._ids),), np.float64),
            max_episode_steps=self._cfg["max_episode_steps"],
            agent_ids=self._ids,
            turn_based=True,
        )
        self._env = env
        return env

    def _obs_space(self, raw: gym.Space, act_space: gym.Space) -> gym.spaces.Dict:
        own = raw["observation"] if isinstance(raw, gym.spaces.Dict) and "observation" in raw.spaces else raw
        if self._cfg["flatten_obs"]:
            if not isinstance(own, gym.spaces.Box):
                raise ValueError(f"{self!r}: flatten_obs needs a Box observation, the game has {own}")
            own = gym.spaces.Box(own.low.reshape(-1).astype(np.float32), own.high.reshape(-1).astype(np.float32))
        spaces: Dict[str, gym.Space] = {"obs": own}
        if isinstance(act_space, gym.spaces.Discrete):
            spaces["action_mask"] = gym.spaces.Box(0, 1, (int(act_space.n),), np.int8)
        spaces["to_play"] = gym.spaces.Discrete(len(self._ids))
        return gym.spaces.Dict(spaces)

    def _observe(self, agent: str) -> Dict[str, Any]:
        raw = self._env.observe(agent)
        own, mask = (raw["observation"], raw.get("action_mask")) if isinstance(raw, dict) else (raw, None)
        obs: Dict[str, Any] = {"obs": np.asarray(own, np.float32).reshape(-1) if self._cfg["flatten_obs"] else own}
        if "action_mask" in self._info.obs_space.spaces:
            n = int(self._info.act_space.n)
            obs["action_mask"] = np.ones(n, np.int8) if mask is None else np.asarray(mask, np.int8)
        obs["to_play"] = np.int64(self._ids.index(agent))
        return obs

    # ---- the contract -----------------------------------------------------------------------------------------
    def seed(self, seed: int) -> None:
        """Make the next ``reset`` call the game's ``reset(seed=seed)`` and seed the action space."""
        self._pending_seed = int(seed)
        if self._info is not None:
            self._info.act_space.seed(self._pending_seed)

    def reset(self) -> Dict[str, Any]:
        """Start a game; return the first seat's observation."""
        env = self._env if self._env is not None else self._build()
        env.reset(seed=self._pending_seed)
        self._pending_seed = None
        self._running, self._moves = True, 0
        self._returns = np.zeros(len(self._ids))
        return self._observe(env.agent_selection)

    def step(self, action: Any) -> BaseEnvTimestep:
        """Play ``action`` for the seat ``to_play``; see the class docstring for what comes back.

        Raises:
            RuntimeError: no ``reset`` since construction or the last ``done``.
            ValueError: the action is illegal here (names the seat and the legal actions).
        """
        if not self._running:
            raise RuntimeError(f"{self!r}: step() before reset(); reset the env first and after every done step")
        env, seat = self._env, self._env.agent_selection
        action = self._check_action(seat, action)
        env.step(action)
        reward = np.asarray([float(env.rewards.get(a, 0.0)) for a in self._ids])
        self._returns += reward
        self._moves += 1
        over = all(env.terminations[a] or env.truncations[a] for a in env.agents)
        terminated = over and any(env.terminations[a] for a in env.agents)
        truncated = not terminated and (over or self._moves >= (self._cfg["max_episode_steps"] or np.inf))
        obs = self._observe(env.agent_selection)
        self._skip_dead_seats()
        info: Dict[str, Any] = {"terminated": terminated, "truncated": truncated}
        if terminated or truncated:
            self._running = False
            info.update(
                episode_return=self._returns.copy(),
                episode_len=self._moves,
                outcome=np.sign(self._returns).astype(np.int64),
            )
        return BaseEnvTimestep(obs, reward, terminated or truncated, info)

    def _check_action(self, seat: str, action: Any) -> Any:
        if not isinstance(self._info.act_space, gym.spaces.Discrete):
            return action
        index = as_int_action(action)
        mask = self._observe(seat)["action_mask"]
        if not 0 <= index < len(mask) or not mask[index]:
            legal: List[int] = np.flatnonzero(mask).tolist()
            raise ValueError(f"{self!r}: illegal action {index} for seat {seat} (move {self._moves}); legal: {legal}")
        return index

    def _skip_dead_seats(self) -> None:
        """Step the seats that are out (PettingZoo wants a ``None`` action from each) so a live seat is selected."""
        env = self._env
        while env.agents and (env.terminations[env.agent_selection] or env.truncations[env.agent_selection]):
            env.step(None)

    def info(self) -> BaseEnvInfo:
        """Spaces, the seats (``agent_ids``), a per-seat ``rew_space`` and ``turn_based=True``."""
        if self._info is None:
            self._build()
        return self._info

    def close(self) -> None:
        """Close the game; safe to call twice. A later ``reset`` builds a new one."""
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
