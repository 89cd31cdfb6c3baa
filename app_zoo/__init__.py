"""Ready environments and configs. Importing ``app_zoo`` registers every env whose dependencies are installed:
``cartpole``, ``pendulum`` and ``tictactoe`` always (the game's package is imported when it is built), ``atari``,
``mujoco``, ``sumo`` and ``gfootball`` through their own guarded imports; ``multiagent`` (baselines for the
``pettingzoo_parallel`` and ``lbforaging`` envs of ``nervex.envs``, needs scipy) likewise."""

import importlib

from . import classic_control, games  # noqa: F401

for _name in ("app_zoo.atari", "app_zoo.mujoco", "app_zoo.multiagent", "app_zoo.sumo", "app_zoo.gfootball"):
    try:
        importlib.import_module(_name)
    except ImportError:  # the package itself is absent; missing extras are reported when the env is built
        pass
