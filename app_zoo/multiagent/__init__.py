"""Cooperative multi-agent tasks: mpe2 (simple_spread) and Level-Based Foraging through nervex's adapters
(``env_type: pettingzoo_parallel`` / ``lbforaging``), their baselines (random, heuristics) and configs.

The envs themselves are ``nervex.envs.PettingZooParallelEnv`` and ``nervex.envs.LBForagingEnv``; importing this
package registers nothing new. Configs: ``app_zoo/multiagent/<mpe|lbf|vmas|two_step>/config/<task>_<policy>.yaml``.
"""

from . import lbf, mpe  # noqa: F401
