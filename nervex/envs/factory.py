"""Env lookup by registered name: ``get_env_cls('cartpole')``, ``create_env({'env_type': 'gym', ...})``."""

from __future__ import annotations

import importlib
from typing import Any, Mapping, Optional

import gymnasium as gym

from nervex.utils.registry import ENV_REGISTRY

from .base_env import BaseEnv

# keys of a compiled ``env`` config section that belong to the pipeline, not to the env class
ENV_PIPELINE_KEYS = ("env_type", "import_names", "manager_type", "collector_env_num", "evaluator_env_num", "manager")


def get_env_cls(name: str) -> type:
    """Return the env class registered as ``name`` (``'gym'``, ``'cartpole'``...).

    ``app_zoo`` envs register on import; an unknown name triggers that import once before giving up.

    Raises:
        KeyError: unknown name; lists the registered names, the nearest one, and says so when ``name`` is a
            Gymnasium id (use ``env_type: gym`` with ``env_id``).
    """
    if name not in ENV_REGISTRY:
        for module in ("app_zoo.classic_control", "app_zoo", "nervex.envs.vmas_env"):
            try:
                importlib.import_module(module)
            except ImportError:
                pass
    if name in ENV_REGISTRY:
        return ENV_REGISTRY.get(name)
    msg = ENV_REGISTRY.unknown_message(name)
    if isinstance(name, str) and name in gym.registry:
        msg += f"; '{name}' is a Gymnasium id: use env_type 'gym' with env_id '{name}'"
    raise KeyError(msg)


def create_env(cfg: Optional[Mapping[str, Any]] = None) -> BaseEnv:
    """Build the env a config describes: ``env_type`` (default ``'gym'``) picks the class, the rest is its config.

    Pipeline keys of a compiled ``env`` section (``manager_type``, ``collector_env_num``...) are ignored, so
    ``create_env(cfg.env)`` works.

    Example:
        >>> env = create_env({'env_type': 'gym', 'env_id': 'Pendulum-v1'})
    """
    cfg = dict(cfg or {})
    env_cls = get_env_cls(cfg.get("env_type", "gym"))
    return env_cls({k: v for k, v in cfg.items() if k not in ENV_PIPELINE_KEYS})
