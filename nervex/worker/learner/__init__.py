from .base_learner import BaseLearner
from .learner_hook import LearnerHook, LoadCkptHook, LogShowHook, LrDecayHook, SaveCkptHook

__all__ = ["BaseLearner", "LearnerHook", "LoadCkptHook", "SaveCkptHook", "LogShowHook", "LrDecayHook"]
