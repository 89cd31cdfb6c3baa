"""CartPole-v1 whose every step burns CPU time: the env of ``bench/parallel.py``'s scaling measurement.

Registered as ``cartpole_burn``; a config reaches it with ``env.env_type: cartpole_burn`` and
``env.import_names: [bench.slow_env]`` (every role imports it from the repository root, which ``bench/parallel.py``
puts on ``PYTHONPATH``). ``burn_ms`` (default 1.0) is CPU time of the stepping thread, not wall time, as in
``bench/env_throughput.py``: a descheduled process does not get its work done for free, so more processes than cores
cannot look faster than the cores allow.
"""

from __future__ import annotations

import time
from typing import Any, Dict, Mapping, Optional

from nervex.envs import GymEnv
from nervex.envs.base_env import BaseEnvTimestep
from nervex.utils import ENV_REGISTRY


def burn_cpu(seconds: float) -> None:
    """Busy-loop until this thread has used ``seconds`` of CPU time."""
    deadline = time.thread_time() + seconds
    while time.thread_time() < deadline:
        pass


@ENV_REGISTRY.register("cartpole_burn")
class BurnCartPoleEnv(GymEnv):
    """CartPole-v1 (4 float32 observations, 2 actions, 500-step limit) whose ``step`` first burns ``burn_ms`` of CPU.

    Example:
        >>> env = BurnCartPoleEnv({"burn_ms": 1.0})
        >>> obs = env.reset()
        >>> env.step(0).reward
        1.0
    """

    config: Dict[str, Any] = dict(GymEnv.config, env_id="CartPole-v1", burn_ms=1.0)

    def __init__(self, cfg: Optional[Mapping[str, Any]] = None) -> None:
        super().__init__(cfg)
        burn_ms = self._cfg["burn_ms"]
        if isinstance(burn_ms, bool) or not isinstance(burn_ms, (int, float)) or burn_ms < 0:
            raise ValueError(f"cartpole_burn config key 'burn_ms' must be a number >= 0, got {burn_ms!r}")
        self._burn_s = float(burn_ms) / 1000.0

    def step(self, action: Any) -> BaseEnvTimestep:
        burn_cpu(self._burn_s)
        return super().step(action)


__all__ = ["BurnCartPoleEnv", "burn_cpu"]
