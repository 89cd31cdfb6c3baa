"""Import gfootball's old-``gym`` code on Gymnasium, without the ``gym`` package.

gfootball (2.10) is written against the pre-0.26 ``gym`` API: ``import gym``, ``gym.Env`` subclasses whose ``reset()``
returns the observation and whose ``step`` returns ``(obs, reward, done, info)``, and ``gym.Wrapper`` /
``gym.ObservationWrapper`` / ``gym.RewardWrapper`` subclasses that pass those through. nervex does not depend on
``gym`` (and a ``gym`` >= 0.26 installed for another package has wrappers that unpack five values, which breaks
gfootball too). :func:`import_gfootball_env` imports ``gfootball.env`` while ``sys.modules['gym']`` is a small module
built here on Gymnasium:

- ``gym.Env`` is ``gymnasium.Env`` and ``gym.spaces`` is ``gymnasium.spaces`` (same constructors);
- ``gym.Wrapper``, ``gym.ObservationWrapper``, ``gym.RewardWrapper`` are :class:`Wrapper`,
  :class:`ObservationWrapper`, :class:`RewardWrapper` below: the old API (``reset() -> obs``, 4-tuple ``step``);
- ``gym.envs.registration.register`` records gfootball's ``GFootball-*`` ids in :data:`OLD_GYM_REGISTRY` instead of
  Gymnasium's registry (they name old-API envs that ``gymnasium.make`` could not drive);
- ``gym.make`` raises (gfootball calls it only in its examples and remote env).

The previous ``sys.modules`` entries (a real ``gym`` or none) are restored when the import is done; gfootball's modules
keep the names they bound, so only they see the shim.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import sys
import threading
import types
from typing import Any, Dict, Iterator, Optional, Tuple

import gymnasium

INSTALL_HINT = "app_zoo/gfootball/install.sh .venv"
OLD_GYM_MODULES = ("gym", "gym.spaces", "gym.envs", "gym.envs.registration")
OLD_GYM_REGISTRY: Dict[str, Dict[str, Any]] = {}
"""The ids gfootball registers on import (``GFootball-<scenario>-<representation>-v0``) and their kwargs."""

_lock = threading.Lock()


class Wrapper(gymnasium.Env):
    """``gym.Wrapper`` of the old API: ``reset(**kwargs) -> obs``, ``step(action) -> (obs, reward, done, info)``.

    Public attributes the wrapper lacks are read from the wrapped env (private ones are not, as in old ``gym``);
    ``observation_space`` / ``action_space`` are the wrapped env's until a wrapper assigns its own.
    """

    def __init__(self, env: Any) -> None:
        self.env = env
        self._observation_space: Optional[gymnasium.Space] = None
        self._action_space: Optional[gymnasium.Space] = None

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(f"{type(self).__name__} has no private attribute {name!r} (not forwarded)")
        return getattr(self.env, name)

    @property
    def observation_space(self) -> gymnasium.Space:
        return self.env.observation_space if self._observation_space is None else self._observation_space

    @observation_space.setter
    def observation_space(self, space: gymnasium.Space) -> None:
        self._observation_space = space

    @property
    def action_space(self) -> gymnasium.Space:
        return self.env.action_space if self._action_space is None else self._action_space

    @action_space.setter
    def action_space(self, space: gymnasium.Space) -> None:
        self._action_space = space

    @property
    def unwrapped(self) -> Any:
        return self.env.unwrapped

    def step(self, action: Any) -> Tuple[Any, Any, bool, Dict[str, Any]]:
        return self.env.step(action)

    def reset(self, **kwargs: Any) -> Any:
        return self.env.reset(**kwargs)

    def render(self, *args: Any, **kwargs: Any) -> Any:
        return self.env.render(*args, **kwargs)

    def close(self) -> None:
        return self.env.close()


class ObservationWrapper(Wrapper):
    """Old-API ``gym.ObservationWrapper``: ``observation(obs)`` maps what ``reset`` and ``step`` return."""

    def reset(self, **kwargs: Any) -> Any:
        return self.observation(self.env.reset(**kwargs))

    def step(self, action: Any) -> Tuple[Any, Any, bool, Dict[str, Any]]:
        obs, reward, done, info = self.env.step(action)
        return self.observation(obs), reward, done, info

    def observation(self, observation: Any) -> Any:
        raise NotImplementedError


class RewardWrapper(Wrapper):
    """Old-API ``gym.RewardWrapper``: ``reward(r)`` maps the reward ``step`` returns."""

    def step(self, action: Any) -> Tuple[Any, Any, bool, Dict[str, Any]]:
        obs, reward, done, info = self.env.step(action)
        return obs, self.reward(reward), done, info

    def reward(self, reward: Any) -> Any:
        raise NotImplementedError


def _register(id: str, entry_point: Any = None, **kwargs: Any) -> None:  # noqa: A002 - gym's keyword
    OLD_GYM_REGISTRY[id] = dict(entry_point=entry_point, **kwargs)


def _make(id: str, *args: Any, **kwargs: Any) -> Any:  # noqa: A002 - gym's keyword
    raise NotImplementedError(
        f"gym.make({id!r}) is not available under nervex's gym shim; build gfootball envs with "
        f"gfootball.env.create_environment (nervex: env_type 'gfootball')"
    )


def make_old_gym_modules() -> Dict[str, types.ModuleType]:
    """The modules that stand in for ``gym``, ``gym.spaces``, ``gym.envs`` and ``gym.envs.registration``."""
    gym = types.ModuleType("gym", "nervex's stand-in for the old gym API, on Gymnasium (app_zoo/gfootball)")
    envs = types.ModuleType("gym.envs")
    registration = types.ModuleType("gym.envs.registration")
    registration.register = _register
    registration.registry = OLD_GYM_REGISTRY
    envs.registration = registration
    envs.register = _register
    gym.Env = gymnasium.Env
    gym.Space = gymnasium.Space
    gym.spaces = gymnasium.spaces
    gym.Wrapper = Wrapper
    gym.ObservationWrapper = ObservationWrapper
    gym.RewardWrapper = RewardWrapper
    gym.envs = envs
    gym.make = _make
    gym.register = _register
    gym.__version__ = "0.21.0+nervex.shim"  # the API it imitates
    gym.__path__ = []  # a package, so `from gym.envs.registration import register` resolves through sys.modules
    envs.__path__ = []
    return {"gym": gym, "gym.spaces": gymnasium.spaces, "gym.envs": envs, "gym.envs.registration": registration}


@contextlib.contextmanager
def old_gym_api() -> Iterator[types.ModuleType]:
    """Within the block ``import gym`` gives the shim (yielded); the previous ``sys.modules`` entries come back after."""
    with _lock:
        saved = {name: sys.modules.get(name) for name in OLD_GYM_MODULES}
        modules = make_old_gym_modules()
        sys.modules.update(modules)
        try:
            yield modules["gym"]
        finally:
            for name, module in saved.items():
                if module is None:
                    sys.modules.pop(name, None)
                else:
                    sys.modules[name] = module


def gfootball_available() -> bool:
    """Whether the gfootball package and its compiled engine are installed (nothing is imported)."""
    try:
        return (
            importlib.util.find_spec("gfootball") is not None
            and importlib.util.find_spec("gfootball_engine._gameplayfootball") is not None
        )
    except (ImportError, ValueError):  # a parent package that fails to import, or a broken spec
        return False


def _uses_shim(module: types.ModuleType) -> bool:
    bound = getattr(module, "gym", None)
    return bound is None or bound.Wrapper is Wrapper


def import_gfootball_env() -> types.ModuleType:
    """Import ``gfootball.env`` (and ``gfootball``) with ``import gym`` resolved to the Gymnasium shim.

    gfootball modules imported earlier against another ``gym`` are dropped from ``sys.modules`` and imported again
    (the compiled ``gfootball_engine`` is kept).

    Returns:
        The ``gfootball.env`` module (``create_environment``...).

    Raises:
        ImportError: gfootball or its engine is not installed; the message names the install script.
    """
    loaded = sys.modules.get("gfootball.env.football_env")
    if loaded is not None and _uses_shim(loaded):
        return sys.modules["gfootball.env"]
    if not gfootball_available():
        raise ImportError(
            "env_type 'gfootball' needs Google Research Football (the gfootball package and its compiled engine), "
            f"which is not installed; build it with: {INSTALL_HINT} (Debian packages, 20-30 minutes)"
        )
    for name in [n for n in sys.modules if n == "gfootball" or n.startswith("gfootball.")]:
        del sys.modules[name]
    with old_gym_api():
        importlib.import_module("gfootball")
        return importlib.import_module("gfootball.env")


__all__ = [
    "INSTALL_HINT",
    "OLD_GYM_REGISTRY",
    "Wrapper",
    "ObservationWrapper",
    "RewardWrapper",
    "make_old_gym_modules",
    "old_gym_api",
    "gfootball_available",
    "import_gfootball_env",
]
