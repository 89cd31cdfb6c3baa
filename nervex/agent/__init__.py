"""Agent: wraps a model with a target copy and plugins (sampling, grad mode, recurrent state)."""

from .agent import Agent
from .plugins import (
    PLUGINS,
    AgentPlugin,
    ArgmaxSamplePlugin,
    EpsGreedySamplePlugin,
    GradPlugin,
    HiddenStatePlugin,
    MultinomialSamplePlugin,
    create_plugin,
)
from .target import TargetUpdater

__all__ = [
    "Agent",
    "AgentPlugin",
    "ArgmaxSamplePlugin",
    "EpsGreedySamplePlugin",
    "MultinomialSamplePlugin",
    "GradPlugin",
    "HiddenStatePlugin",
    "PLUGINS",
    "create_plugin",
    "TargetUpdater",
]
