from .cartpole_env import CartPoleEnv

__all__ = ["CartPoleEnv"]
