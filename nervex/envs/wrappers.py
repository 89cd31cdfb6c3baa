"""Small Gymnasium wrappers that ``GymEnv`` applies by name (config key ``wrappers``).

A ``wrappers`` entry is a registered name (``'clip_reward'``) or a mapping with the name under ``type`` and the
wrapper's keyword arguments next to it (``{'type': 'scale_reward', 'scale': 0.1}``). Entries apply in list order,
so the first one sits closest to the raw env.

Reward wrappers keep the untransformed reward in ``info['raw_reward']`` (the innermost one wins), and ``GymEnv``
sums that into ``episode_return``: the return in the logs stays the game's score whatever the learner sees.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Dict, List, Mapping, Sequence, SupportsFloat, Tuple, Union

import gymnasium as gym
import numpy as np

from nervex.utils.registry import Registry

ENV_WRAPPER_REGISTRY = Registry("env wrapper")
WrapperSpec = Union[str, Mapping[str, Any]]


class _RewardTransform(gym.Wrapper):
    """Apply ``transform`` to every reward; keep the untransformed one in ``info['raw_reward']``."""

    def __init__(self, env: gym.Env, transform: Callable[[float], float]) -> None:
        super().__init__(env)
        self._transform = transform

    def step(self, action: Any) -> Tuple[Any, SupportsFloat, bool, bool, Dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        reward = float(reward)
        info.setdefault("raw_reward", reward)
        return obs, self._transform(reward), terminated, truncated, info


@ENV_WRAPPER_REGISTRY.register("clip_reward")
class ClipReward(_RewardTransform):
    """Clip rewards into ``[low, high]``."""

    def __init__(self, env: gym.Env, low: float = -1.0, high: float = 1.0) -> None:
        if low > high:
            raise ValueError(f"clip_reward: low must be <= high, got low={low}, high={high}")
        super().__init__(env, lambda r: min(max(r, low), high))


@ENV_WRAPPER_REGISTRY.register("sign_reward")
class SignReward(_RewardTransform):
    """Replace rewards by their sign (-1, 0, 1), as DQN on Atari does."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env, lambda r: float(np.sign(r)))


@ENV_WRAPPER_REGISTRY.register("scale_reward")
class ScaleReward(_RewardTransform):
    """Multiply rewards by ``scale``."""

    def __init__(self, env: gym.Env, scale: float = 1.0) -> None:
        super().__init__(env, lambda r: r * scale)


@ENV_WRAPPER_REGISTRY.register("scale_obs")
class ScaleObs(gym.ObservationWrapper):
    """Multiply Box observations by ``scale`` (default 1/255: uint8 images to [0, 1]); the result is ``float32``."""

    def __init__(self, env: gym.Env, scale: float = 1.0 / 255.0) -> None:
        super().__init__(env)
        space = env.observation_space
        if not isinstance(space, gym.spaces.Box):
            raise TypeError(f"scale_obs needs a Box observation space, got {space}")
        self._scale = np.float32(scale)
        # a negative scale swaps the bounds
        a, b = space.low.astype(np.float64) * scale, space.high.astype(np.float64) * scale
        low, high = np.minimum(a, b), np.maximum(a, b)
        self.observation_space = gym.spaces.Box(low.astype(np.float32), high.astype(np.float32), dtype=np.float32)

    def observation(self, observation: Any) -> np.ndarray:
        return np.asarray(observation, dtype=np.float32) * self._scale


@ENV_WRAPPER_REGISTRY.register("mask_observation")
class MaskObservation(gym.ObservationWrapper):
    """Zero the observation entries at ``indices`` (positions in the flattened observation), e.g. velocities.

    Hiding part of the state makes an MDP partially observable, the test bed of recurrent agents (R2D2, DRQN).
    The observation space keeps its shape and dtype; its bounds are widened to include 0 where they did not.
    """

    def __init__(self, env: gym.Env, indices: Sequence[int]) -> None:
        super().__init__(env)
        space = env.observation_space
        if not isinstance(space, gym.spaces.Box):
            raise TypeError(f"mask_observation needs a Box observation space, got {space}")
        if isinstance(indices, (str, bytes)) or not hasattr(indices, "__len__") or len(indices) == 0:
            raise TypeError(f"mask_observation: indices must be a non-empty list of ints, got {indices!r}")
        size = int(np.prod(space.shape))
        for i in indices:
            if isinstance(i, bool) or not isinstance(i, (int, np.integer)) or not 0 <= i < size:
                raise ValueError(
                    f"mask_observation: index {i!r} is not a position in the flattened observation of shape "
                    f"{space.shape} (0 <= index < {size})"
                )
        self._indices = np.array(sorted(set(int(i) for i in indices)), dtype=np.intp)
        low, high = space.low.copy(), space.high.copy()
        np.put(low, self._indices, np.minimum(low.flat[self._indices], 0))
        np.put(high, self._indices, np.maximum(high.flat[self._indices], 0))
        self.observation_space = gym.spaces.Box(low, high, shape=space.shape, dtype=space.dtype)

    @property
    def indices(self) -> Tuple[int, ...]:
        """The masked positions, sorted."""
        return tuple(int(i) for i in self._indices)

    def observation(self, observation: Any) -> np.ndarray:
        # a copy: the inner env may keep (and later update) the array it returned
        masked = np.asarray(observation).copy()
        (masked if masked.ndim == 1 else masked.reshape(-1))[self._indices] = 0  # a C-order copy: reshape is a view
        return masked


# Velocity entries of the classic Gymnasium tasks, as rl-baselines3-zoo's MaskVelocityWrapper hides them.
VELOCITY_INDICES: Dict[str, Tuple[int, ...]] = {
    "CartPole-v0": (1, 3),  # cart velocity, pole angular velocity
    "CartPole-v1": (1, 3),
    "MountainCar-v0": (1,),
    "MountainCarContinuous-v0": (1,),
    "Pendulum-v1": (2,),  # angular velocity
    "Acrobot-v1": (4, 5),  # the two joints' angular velocities
    "LunarLander-v3": (2, 3, 5),  # x and y velocity, angular velocity
    "LunarLanderContinuous-v3": (2, 3, 5),
}


def velocity_indices(env_id: str) -> Tuple[int, ...]:
    """The observation positions of ``env_id``'s velocities (see :data:`VELOCITY_INDICES`).

    Raises:
        KeyError: ``env_id`` is not in the table; the message names the ids that are and ``mask_observation``.
    """
    if env_id not in VELOCITY_INDICES:
        raise KeyError(
            f"no velocity indices are known for '{env_id}' (known: {', '.join(VELOCITY_INDICES)}); use the "
            "'mask_observation' wrapper with the indices instead, e.g. {'type': 'mask_observation', 'indices': [1, 3]}"
        )
    return VELOCITY_INDICES[env_id]


@ENV_WRAPPER_REGISTRY.register("mask_velocity")
def mask_velocity(env: gym.Env) -> gym.Env:
    """Zero the velocities of a classic task (rl-baselines3-zoo's ``*NoVel`` envs, e.g. ``CartPoleNoVel-v1``).

    Raises:
        KeyError: the env's id has no entry in :data:`VELOCITY_INDICES`.
    """
    spec = env.unwrapped.spec
    if spec is None:
        raise KeyError("mask_velocity needs an env built by gymnasium.make (its spec names the task)")
    return MaskObservation(env, velocity_indices(spec.id))


ENV_WRAPPER_REGISTRY.register("flatten_obs", gym.wrappers.FlattenObservation)
ENV_WRAPPER_REGISTRY.register("clip_action", gym.wrappers.ClipAction)


@ENV_WRAPPER_REGISTRY.register("rescale_action")
def rescale_action(env: gym.Env, min_action: float = -1.0, max_action: float = 1.0) -> gym.Env:
    """Let the policy act in ``[min_action, max_action]`` (default ``[-1, 1]``); mapped linearly to the Box space."""
    space = env.action_space
    if not isinstance(space, gym.spaces.Box):
        raise TypeError(f"rescale_action needs a Box action space, got {space}")
    low, high = (np.full(space.shape, bound, dtype=space.dtype) for bound in (min_action, max_action))
    return gym.wrappers.RescaleAction(env, low, high)  # bounds in the space's dtype: no precision warning


def parse_wrappers(specs: Sequence[WrapperSpec]) -> List[Tuple[str, Dict[str, Any]]]:
    """Check a ``wrappers`` config list and return ``[(name, kwargs), ...]`` without building anything.

    Raises:
        KeyError: an unknown wrapper name; the message lists the registered ones.
        TypeError: a malformed entry, or keyword arguments the wrapper does not take.
    """
    if isinstance(specs, (str, Mapping)) or not isinstance(specs, Sequence):
        raise TypeError(f"config key 'wrappers' must be a list of names or mappings, got {specs!r}")
    parsed = []
    for spec in specs:
        if isinstance(spec, str):
            name, kwargs = spec, {}
        elif isinstance(spec, Mapping) and "type" in spec:
            kwargs = {k: v for k, v in spec.items() if k != "type"}
            name = spec["type"]
        else:
            raise TypeError(
                f"wrappers entry {spec!r}: expected a name or a mapping with the name under 'type', "
                f"e.g. {{'type': 'scale_reward', 'scale': 0.1}}"
            )
        factory = ENV_WRAPPER_REGISTRY.get(name)
        try:
            inspect.signature(factory).bind(None, **kwargs)
        except TypeError as e:
            raise TypeError(f"wrappers entry {spec!r}: {e}; {name} takes {inspect.signature(factory)}") from None
        parsed.append((name, kwargs))
    return parsed


def apply_wrappers(env: gym.Env, parsed: Sequence[Tuple[str, Dict[str, Any]]]) -> gym.Env:
    """Wrap ``env`` with the ``(name, kwargs)`` pairs of :func:`parse_wrappers`, first pair innermost."""
    for name, kwargs in parsed:
        env = ENV_WRAPPER_REGISTRY.get(name)(env, **kwargs)
    return env
