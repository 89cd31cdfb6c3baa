"""MuJoCo locomotion tasks (Gymnasium -v5 ids); importing this package registers the ``'mujoco'`` env.

The import works without the ``mujoco`` package; building a ``MujocoEnv`` then raises an ImportError that says
``pip install -e .[mujoco]``.
"""

from .envs import MujocoEnv

__all__ = ["MujocoEnv"]
