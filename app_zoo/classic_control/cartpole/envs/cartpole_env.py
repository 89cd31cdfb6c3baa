"""CartPole-v1 as a nervex env (registered as ``'cartpole'``)."""

from __future__ import annotations

from typing import Any, Dict

from nervex.envs import GymEnv
from nervex.utils import ENV_REGISTRY


@ENV_REGISTRY.register("cartpole")
class CartPoleEnv(GymEnv):
    """Gymnasium's CartPole-v1: 4 float32 observations, 2 discrete actions, reward 1 per step, 500-step limit.

    Example:
        >>> env = CartPoleEnv(cfg={})
        >>> env.info().act_space
        Discrete(2)
    """

    config: Dict[str, Any] = dict(GymEnv.config, env_id="CartPole-v1")
