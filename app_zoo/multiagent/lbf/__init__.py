"""Level-Based Foraging (``env_type: lbforaging``): a scripted heuristic and its baseline run."""

from .envs import lbf_heuristic_action, play_lbf

__all__ = ["lbf_heuristic_action", "play_lbf"]
