"""The gfootball env (registered ``'gfootball'``) and the shim that imports gfootball's old-``gym`` code on Gymnasium."""

from .football_env import REPRESENTATIONS, REWARDS, FootballEnv
from .gym_shim import INSTALL_HINT, gfootball_available, import_gfootball_env, old_gym_api

__all__ = [
    "FootballEnv",
    "REPRESENTATIONS",
    "REWARDS",
    "INSTALL_HINT",
    "gfootball_available",
    "import_gfootball_env",
    "old_gym_api",
]
