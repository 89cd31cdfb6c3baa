from .serial_actor import SerialActor
from .serial_evaluator import SerialEvaluator, eval_episodes_per_env
from .slots import EpisodeResult, Seating

__all__ = ["SerialActor", "SerialEvaluator", "eval_episodes_per_env", "EpisodeResult", "Seating"]
