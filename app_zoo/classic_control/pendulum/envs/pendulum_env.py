"""Pendulum-v1 as a nervex env (registered as ``'pendulum'``)."""

from __future__ import annotations

from typing import Any, Dict

from nervex.envs import GymEnv
from nervex.utils import ENV_REGISTRY


@ENV_REGISTRY.register("pendulum")
class PendulumEnv(GymEnv):
    """Gymnasium's Pendulum-v1: 3 float32 observations, a Box(-2, 2, (1,)) torque, 200-step limit, never terminates.

    Actions may come as a float, a 0-d or a (1,)-shaped array; they are reshaped to ``(1,)``. Add the
    ``'rescale_action'`` wrapper for a policy that outputs actions in ``[-1, 1]``.
    """

    config: Dict[str, Any] = dict(GymEnv.config, env_id="Pendulum-v1")
