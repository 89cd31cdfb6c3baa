from .seating import EpisodeResult, Seating
from .serial_actor import SerialActor
from .serial_evaluator import SerialEvaluator, eval_episodes_per_env

__all__ = ["SerialActor", "SerialEvaluator", "eval_episodes_per_env", "EpisodeResult", "Seating"]
