from .base_learner import BaseLearner
from .learner_hook import LearnerHook, LoadCkptHook, LogShowHook, LrDecayHook, SaveCkptHook
from .loop import EVAL_CSV_FIELDS, FigureMeans, LearnLoop, Trained, index_batch

__all__ = [
    "BaseLearner",
    "LearnerHook",
    "LoadCkptHook",
    "SaveCkptHook",
    "LogShowHook",
    "LrDecayHook",
    "LearnLoop",
    "Trained",
    "FigureMeans",
    "EVAL_CSV_FIELDS",
    "index_batch",
]
