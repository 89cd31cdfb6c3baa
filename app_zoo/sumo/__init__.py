"""SUMO traffic-signal control through sumo-rl on libsumo: the single intersection (``'sumo'``), the 2x2 grid as a
multi-agent task (``'sumo_grid'``), and the fixed-time and actuated baselines (``app_zoo.sumo.envs.baselines``).

The import works without the SUMO wheels; building an env then raises an ImportError that says
``pip install -e .[sumo]``.
"""

from .envs import SumoEnv, SumoGridEnv

__all__ = ["SumoEnv", "SumoGridEnv"]
