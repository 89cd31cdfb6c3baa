"""Classic-control tasks; importing this package registers their envs ('cartpole', 'pendulum')."""

from .cartpole.envs import CartPoleEnv
from .pendulum.envs import PendulumEnv

__all__ = ["CartPoleEnv", "PendulumEnv"]
