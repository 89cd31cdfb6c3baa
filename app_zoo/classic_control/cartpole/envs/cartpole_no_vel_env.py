"""CartPole-v1 without its velocities (registered as ``'cartpole_no_vel'``): a partially observable task."""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional

import gymnasium as gym

from nervex.envs import GymEnv
from nervex.envs.wrappers import MaskObservation, apply_wrappers, velocity_indices
from nervex.utils import ENV_REGISTRY


@ENV_REGISTRY.register("cartpole_no_vel")
class CartPoleNoVelEnv(GymEnv):
    """CartPole-v1 with observation entries 1 and 3 (cart velocity, pole angular velocity) always 0.

    rl-baselines3-zoo's ``CartPoleNoVel-v1``: the dynamics, rewards, termination and 500-step limit are CartPole's,
    the observation keeps its shape ``(4,)`` and space, but a memoryless policy cannot tell which way the pole is
    moving; recurrent agents (DRQN, R2D2) and frame stacking can. The mask sits next to the raw env, under any
    ``wrappers`` of the config, so a configured wrapper sees the masked observation. ``env_id`` stays a CartPole
    id; another id of ``nervex.envs.wrappers.VELOCITY_INDICES`` would get its own velocities masked.

    The same env from a plain ``GymEnv``: ``{'env_type': 'gym', 'env_id': 'CartPole-v1', 'wrappers':
    ['mask_velocity']}``.

    Example:
        >>> env = CartPoleNoVelEnv(cfg={})
        >>> obs = env.reset()
        >>> float(obs[1]), float(obs[3])
        (0.0, 0.0)
    """

    config: Dict[str, Any] = dict(GymEnv.config, env_id="CartPole-v1")

    def __init__(self, cfg: Optional[Mapping[str, Any]] = None) -> None:
        super().__init__(cfg)
        try:
            self._velocity_indices = velocity_indices(self._spec.id)
        except KeyError as e:
            raise ValueError(f"cartpole_no_vel config key 'env_id': {e.args[0]}") from None

    def _make_gym_env(self) -> gym.Env:
        # GymEnv's bare env (no time-limit/order/checker layers; rendering when asked), observations masked
        env = MaskObservation(self._make_bare_env(dict(self._cfg["env_kwargs"])), self._velocity_indices)
        return apply_wrappers(env, self._wrappers)
