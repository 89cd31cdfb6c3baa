from .pendulum_env import PendulumEnv

__all__ = ["PendulumEnv"]
