"""The MuJoCo env; importing registers ``'mujoco'`` (the ``mujoco`` package is needed only to build one)."""

from .mujoco_env import MujocoEnv

__all__ = ["MujocoEnv"]
