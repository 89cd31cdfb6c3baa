"""Ready environments and configs. Importing ``app_zoo`` registers every env whose dependencies are installed:
``cartpole`` and ``pendulum`` always, ``atari`` and ``mujoco`` through their own guarded imports."""

import importlib

from . import classic_control  # noqa: F401

for _name in ("app_zoo.atari", "app_zoo.mujoco"):
    try:
        importlib.import_module(_name)
    except ImportError:  # the package itself is absent; missing extras are reported when the env is built
        pass
