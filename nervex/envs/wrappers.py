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
