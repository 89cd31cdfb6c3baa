"""Env managers: several envs behind one ``step({env_id: action}) -> {env_id: timestep}`` interface."""

from .base_env_manager import BaseEnvManager, EnvError, abnormal_timestep
from .subprocess_env_manager import SubprocessEnvManager
from .vmas_env_manager import VmasEnvManager

__all__ = ["BaseEnvManager", "SubprocessEnvManager", "VmasEnvManager", "EnvError", "abnormal_timestep"]
