"""Multi-agent particle environments (mpe2) through the PettingZoo ParallelEnv adapter: simple_spread's baselines."""

from .envs import gap_closed, measure_spread_baselines, spread_coverage, spread_heuristic_action

__all__ = ["gap_closed", "measure_spread_baselines", "spread_coverage", "spread_heuristic_action"]
