from .cartpole_env import CartPoleEnv
from .cartpole_no_vel_env import CartPoleNoVelEnv

__all__ = ["CartPoleEnv", "CartPoleNoVelEnv"]
