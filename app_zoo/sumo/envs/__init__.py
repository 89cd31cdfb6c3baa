"""The SUMO envs; importing registers ``'sumo'`` and ``'sumo_grid'`` (the SUMO wheels are needed only to build one)."""

from .backend import LibsumoBusyError, LibsumoSlot, apply_agent_selector_shim, load_sumo_rl
from .grid import SumoGridEnv
from .sumo_env import SumoEnv

__all__ = ["SumoEnv", "SumoGridEnv", "LibsumoBusyError", "LibsumoSlot", "apply_agent_selector_shim", "load_sumo_rl"]
