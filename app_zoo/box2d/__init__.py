"""Box2D tasks (LunarLander, BipedalWalker, CarRacing) through GymEnv; needs ``pip install nervex[box2d]``."""
