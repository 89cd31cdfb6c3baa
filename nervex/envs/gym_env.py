"""``GymEnv``: any Gymnasium id as a nervex env, with the time limit, episode figures and seeding of the contract."""

from __future__ import annotations

import copy
import dataclasses
import difflib
import importlib
import sys
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

import gymnasium as gym
import numpy as np

from nervex.utils.registry import ENV_REGISTRY

from .base_env import BaseEnv, BaseEnvInfo, BaseEnvTimestep
from .wrappers import apply_wrappers, parse_wrappers

NO_LIMIT = sys.maxsize  # "no time limit" as an int keeps the per-step comparison int-to-int
_new_timestep = tuple.__new__  # BaseEnvTimestep(...) through NamedTuple.__new__ costs ~2x more per step


class UnknownEnvIdError(ValueError):
    """A Gymnasium id that is not registered (the message suggests the closest registered one)."""


def check_episode_limit(owner: str, limit: Any) -> Optional[int]:
    """An env's ``max_episode_steps``: None or an int >= 1 (``1e3`` from a config file reads as 1000).

    Raises:
        ValueError: any other value, naming ``owner``'s config key.
    """
    if isinstance(limit, float) and limit.is_integer():
        limit = int(limit)
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"{owner} config key 'max_episode_steps' must be None or an int >= 1, got {limit!r}")
    return limit


def check_env_cfg(env_cls: type, cfg: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
    """Return ``env_cls.config`` deep-merged one level with ``cfg``, rejecting keys the class does not declare.

    Raises:
        KeyError: an unknown key; the message names the class, the valid keys and the closest one.
    """
    defaults: Dict[str, Any] = getattr(env_cls, "config", {})
    merged = copy.deepcopy(defaults)
    for key, value in (cfg or {}).items():
        if key not in defaults:
            close = difflib.get_close_matches(str(key), list(defaults), n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            raise KeyError(f"unknown {env_cls.__name__} config key '{key}'; valid keys: {sorted(defaults)}{hint}")
        merged[key] = copy.deepcopy(value)
    return merged


def find_gym_spec(env_id: str) -> gym.envs.registration.EnvSpec:
    """Look a Gymnasium id up without building the env (``'module:Id'`` imports ``module`` first, as gym.make does).

    Raises:
        UnknownEnvIdError: the id is not registered; names it and the closest registered id.
    """
    if not isinstance(env_id, str) or not env_id:
        raise UnknownEnvIdError(
            f"GymEnv config key 'env_id' must be a Gymnasium id such as 'CartPole-v1', got {env_id!r}"
        )
    module, sep, name = env_id.rpartition(":")
    if sep:
        importlib.import_module(module)
    try:
        return gym.spec(name)
    except gym.error.Error as e:
        ids = list(gym.registry)
        by_lower = {i.lower(): i for i in ids}
        close = difflib.get_close_matches(name.lower(), list(by_lower), n=1, cutoff=0.5)
        hint = f"did you mean '{by_lower[close[0]]}'? " if close else ""
        raise UnknownEnvIdError(
            f"unknown Gymnasium env id '{env_id}' (GymEnv config key 'env_id'); {hint}({len(ids)} ids are registered, "
            f"see gymnasium.pprint_registry(); ids of other packages need their import, e.g. 'ale_py:ALE/Pong-v5'). "
            f"Gymnasium says: {e}"
        ) from None


def _float32_box(space: gym.Space) -> Optional[gym.spaces.Box]:
    """The float32 version of a floating Box space other than float32, else None."""
    if isinstance(space, gym.spaces.Box) and space.dtype.kind == "f" and space.dtype != np.float32:
        with np.errstate(over="ignore"):  # float64 bounds beyond float32's range become +-inf, which is right
            return gym.spaces.Box(space.low.astype(np.float32), space.high.astype(np.float32), dtype=np.float32)
    return None


def _declared_reward_space(env: gym.Env) -> Optional[gym.spaces.Box]:
    """The float64 ``Box`` of a vector ``reward_space`` the Gymnasium env declares (shape ``(n,)``), else None.

    Multi-agent and multi-objective Gymnasium envs (MO-Gymnasium's convention) declare ``reward_space``; a scalar
    or absent one means a plain float reward.
    """
    try:
        space = env.get_wrapper_attr("reward_space")
    except AttributeError:
        return None
    if not isinstance(space, gym.spaces.Box) or len(space.shape) != 1:
        return None
    return gym.spaces.Box(space.low.astype(np.float64), space.high.astype(np.float64), space.shape, np.float64)


def _discrete_action(action: Any) -> Any:
    # a NumPy integer scalar: gymnasium's Discrete.contains (asserted in every CartPole step) takes its fast path for
    # those, and builds an np.iinfo for a Python int (5 us of a 13 us step)
    if isinstance(action, np.integer):
        return action
    if type(action) is int:
        return np.int64(action)
    try:
        return np.int64(action.item())  # 0-d or 1-element arrays, torch tensors
    except AttributeError:
        return np.int64(int(action))


def _box_action(space: gym.spaces.Box) -> Callable[[Any], np.ndarray]:
    dtype, shape, size = space.dtype, space.shape, int(np.prod(space.shape))

    def convert(action: Any) -> np.ndarray:
        action = np.asarray(action, dtype=dtype)
        if action.shape != shape:
            if action.size != size:
                raise ValueError(f"action of shape {action.shape} does not fit the action space {space}")
            action = action.reshape(shape)
        return action

    return convert


@ENV_REGISTRY.register("gym")
class GymEnv(BaseEnv):
    """Any Gymnasium env as a nervex env.

    Config keys (``GymEnv.config``):

    - ``env_id``: a Gymnasium id (``'module:Id'`` imports ``module`` first).
    - ``max_episode_steps``: time limit in steps of this env (after wrappers); ``None`` takes the id's registered
      limit (500 for CartPole-v1). Reaching it sets ``info['truncated']``; it is never a termination.
    - ``env_kwargs``: keyword arguments for ``gymnasium.make``.
    - ``wrappers``: names from :data:`nervex.envs.wrappers.ENV_WRAPPER_REGISTRY`, applied in order.

    The Gymnasium env is built on first use (``reset``, ``info``, ``gym_env``), so a fresh ``GymEnv`` is cheap to
    build and to pickle into a subprocess; pickling carries the config and a pending seed, never the live env.
    It is built without Gymnasium's ``TimeLimit``/``OrderEnforcing``/``PassiveEnvChecker`` layers: this class does
    their work itself, which keeps the per-step overhead under a microsecond. ``nervex.envs.check_env`` runs the
    Gymnasium checker on ``gym_env`` when an env needs vetting.

    Rewards are Python floats; a Gymnasium env that declares a vector ``reward_space`` (shape ``(n,)``: one reward
    per agent or objective) gives float64 arrays of that shape instead (``info()``: ``agent_num = n``, ``agent_ids``
    ``('agent_0', ...)``, ``rew_space`` that Box; ``episode_return`` an array); a vector reward without one is a
    ``ValueError`` naming the fix (it is never squeezed into a float).

    Observations of floating Box spaces come as ``float32`` (``info().obs_space`` says so); integer Box spaces
    (images) keep their dtype; Discrete observations come as 0-d ``int64`` arrays. A subclass builds a different
    Gymnasium env by overriding :meth:`_make_gym_env`.
    """

    config: Dict[str, Any] = dict(env_id="CartPole-v1", max_episode_steps=None, env_kwargs={}, wrappers=[])

    def __init__(self, cfg: Optional[Mapping[str, Any]] = None) -> None:
        merged = check_env_cfg(type(self), cfg)
        super().__init__(merged)
        self._env_id: str = merged["env_id"]
        self._spec = find_gym_spec(self._env_id)
        limit = check_episode_limit("GymEnv", merged["max_episode_steps"])
        self._max_episode_steps: Optional[int] = limit if limit is not None else self._spec.max_episode_steps
        self._limit = self._max_episode_steps or NO_LIMIT
        self._wrappers = parse_wrappers(merged["wrappers"])
        if not isinstance(merged["env_kwargs"], Mapping):
            raise TypeError(f"GymEnv config key 'env_kwargs' must be a mapping, got {merged['env_kwargs']!r}")
        self._env: Optional[gym.Env] = None
        self._info: Optional[BaseEnvInfo] = None
        self._obs_dtype: Optional[np.dtype] = None
        self._act_convert: Optional[Callable[[Any], Any]] = None
        self._pending_seed: Optional[int] = None
        self._running = False  # between a reset and the episode's end: step is allowed
        self._elapsed = 0  # steps since the last reset (the time limit's count)
        self._episode_return = 0.0
        self._episode_len = 0
        self._game_goes_on = False  # the last done said info['game_over'] = False: keep the episode figures
        self._reward_shape: Optional[Tuple[int, ...]] = None  # (n,): the env declares a vector reward_space
        self._render_mode: Optional[str] = None  # enable_rendering: gymnasium.make's render_mode
        self._wrap_bare: Optional[Callable[[gym.Env], gym.Env]] = None  # enable_rendering: around the bare env

    # ---- building ---------------------------------------------------------------------------------------------
    def _make_gym_env(self) -> gym.Env:
        """Build the Gymnasium env: :meth:`_make_bare_env` with ``env_kwargs``, then ``wrappers``."""
        return apply_wrappers(self._make_bare_env(dict(self._cfg["env_kwargs"])), self._wrappers)

    def _make_bare_env(self, kwargs: Dict[str, Any]) -> gym.Env:
        """``gymnasium.make`` on the spec without its default wrappers (time limit, order, checker), with the render
        mode and the wrapper :meth:`enable_rendering` asked for. Subclasses that override ``_make_gym_env`` build the
        bare env through this, so that rendering works for them too."""
        bare = dataclasses.replace(self._spec, max_episode_steps=None, order_enforce=False, disable_env_checker=True)
        if self._render_mode is not None:
            kwargs = {**kwargs, "render_mode": self._render_mode}
        env = gym.make(bare, **kwargs)
        return env if self._wrap_bare is None else self._wrap_bare(env)

    # ---- rendering --------------------------------------------------------------------------------------------
    def render_modes(self) -> Tuple[str, ...]:
        """The render modes the Gymnasium env declares (``metadata['render_modes']``); builds the env if needed."""
        return tuple(self.gym_env.metadata.get("render_modes") or ())

    def video_fps(self) -> Optional[float]:
        """Frames per second at which the bare env's rendered frames play in real time (``metadata['render_fps']``;
        None when the env does not say)."""
        return self.gym_env.metadata.get("render_fps")

    def enable_rendering(
        self, render_mode: str = "rgb_array", wrap_bare: Optional[Callable[[gym.Env], gym.Env]] = None
    ) -> None:
        """Build the Gymnasium env with ``render_mode``, and with ``wrap_bare`` around the bare env, inside this env's
        other wrappers: a video recorder there sees every frame the game renders (Atari: every emulator frame, in
        colour, before the DeepMind preprocessing). Closes the env if it is built: the next ``reset`` builds it anew.

        ``wrap_bare`` is usually a closure, which does not pickle: rendering is for an env stepped in this process.
        """
        self.close()
        self._render_mode = render_mode
        self._wrap_bare = wrap_bare

    def _build(self) -> gym.Env:
        env = self._make_gym_env()
        obs_space, act_space = env.observation_space, env.action_space
        f32 = _float32_box(obs_space)
        self._obs_dtype = np.dtype(np.float32) if f32 is not None else None
        if isinstance(obs_space, gym.spaces.Discrete):
            self._obs_dtype = np.dtype(np.int64)  # a 0-d array instead of a Python int: obs are always arrays
        if isinstance(act_space, gym.spaces.Discrete):
            self._act_convert = _discrete_action
        elif isinstance(act_space, gym.spaces.Box):
            self._act_convert = _box_action(act_space)
        if self._pending_seed is not None:
            act_space.seed(self._pending_seed)
        rew_space = _declared_reward_space(env)
        self._reward_shape = None if rew_space is None else rew_space.shape
        agent_num = 1 if rew_space is None else rew_space.shape[0]
        self._info = BaseEnvInfo(
            agent_num=agent_num,
            obs_space=f32 if f32 is not None else obs_space,
            act_space=act_space,
            rew_space=rew_space,
            max_episode_steps=self._max_episode_steps,
            agent_ids=() if rew_space is None else tuple(f"agent_{i}" for i in range(agent_num)),
        )
        self._env = env
        return env

    def _vector_reward(self, reward: Any) -> np.ndarray:
        reward = np.asarray(reward, np.float64)
        if reward.shape != self._reward_shape:
            raise ValueError(
                f"{self!r}: reward of shape {reward.shape}, but the env's reward_space says {self._reward_shape}"
            )
        return reward

    def _scalar_reward_error(self, reward: Any) -> ValueError:
        return ValueError(
            f"{self!r}: the env returned a reward of shape {np.shape(reward)} but declares no reward_space; a "
            f"vector reward (one per agent) needs the Gymnasium env to declare `reward_space = Box(..., (n,))`"
        )

    @property
    def gym_env(self) -> gym.Env:
        """The Gymnasium env inside (built on first access)."""
        return self._env if self._env is not None else self._build()

    # ---- the contract -----------------------------------------------------------------------------------------
    def seed(self, seed: int) -> None:
        """Make the next ``reset`` call ``reset(seed=seed)`` and seed the action space; later resets continue."""
        self._pending_seed = int(seed)
        if self._env is not None:
            self._env.action_space.seed(self._pending_seed)

    def reset(self) -> Any:
        """Start an episode and return its first observation."""
        env = self._env if self._env is not None else self._build()
        if self._pending_seed is not None:
            obs, _ = env.reset(seed=self._pending_seed)
            self._pending_seed = None
        else:
            obs, _ = env.reset()
        self._running = True
        self._elapsed = 0
        if not self._game_goes_on:
            self._episode_return, self._episode_len = 0.0, 0
        return np.asarray(obs, self._obs_dtype) if self._obs_dtype is not None else obs

    def step(self, action: Any) -> BaseEnvTimestep:
        """Advance one step; see :class:`BaseEnvTimestep` for what comes back.

        Raises:
            RuntimeError: no ``reset`` since construction or since the last ``done``.
        """
        if not self._running:
            raise RuntimeError(f"{self!r}: step() before reset(); reset the env first and after every done step")
        if self._act_convert is not None:
            action = self._act_convert(action)
        obs, reward, terminated, truncated, info = self._env.step(action)
        if self._obs_dtype is not None:
            obs = np.asarray(obs, self._obs_dtype)
        if self._reward_shape is None:
            try:
                reward = float(reward)
            except TypeError:
                raise self._scalar_reward_error(reward) from None
        else:
            reward = self._vector_reward(reward)
        self._episode_return = self._episode_return + info.get("raw_reward", reward)
        self._episode_len += 1
        self._elapsed += 1
        terminated = bool(terminated)
        truncated = self._elapsed >= self._limit or bool(truncated)
        info["terminated"] = terminated
        info["truncated"] = truncated
        if terminated or truncated:
            self._end_episode(info)
            return _new_timestep(BaseEnvTimestep, (obs, reward, True, info))
        return _new_timestep(BaseEnvTimestep, (obs, reward, False, info))

    def _end_episode(self, info: Dict[str, Any]) -> None:
        self._running = False
        # An env may end a learning episode inside a longer game (episodic life): its figures come at the real end.
        self._game_goes_on = info.get("game_over", True) is False
        if not self._game_goes_on:
            ret = self._episode_return
            info["episode_return"] = float(ret) if self._reward_shape is None else np.array(ret, np.float64)
            info["episode_len"] = self._episode_len

    def info(self) -> BaseEnvInfo:
        """Spaces (observations as returned: float32 for floating Box spaces) and the time limit."""
        if self._info is None:
            self._build()
        return self._info

    def close(self) -> None:
        """Close the Gymnasium env; safe to call twice. A later ``reset`` builds a new one."""
        env, self._env = self._env, None
        self._running = False
        if env is not None:
            env.close()

    # ---- pickling: config and pending seed only ----------------------------------------------------------------
    def __getstate__(self) -> Dict[str, Any]:
        state = self.__dict__.copy()
        state.update(_env=None, _info=None, _running=False, _obs_dtype=None, _act_convert=None)
        return state

    @property
    def env_id(self) -> str:
        return self._env_id

    def __repr__(self) -> str:
        return f"{type(self).__name__}(env_id={self._env_id!r})"
