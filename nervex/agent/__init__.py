"""Agent: wraps a model with a target copy and plugins (sampling, exploration noise, grad mode, recurrent state)."""

from .agent import Agent, set_train_mode
from .colored_noise import (
    AR1Noise,
    ColoredGaussianSamplePlugin,
    NoiseProcess,
    PinkNoise,
    make_noise_process,
    powerlaw_noise,
)
from .noise import GaussianNoisePlugin, OUNoisePlugin
from .plugins import (
    PLUGIN_REGISTRY,
    AgentPlugin,
    ArgmaxSamplePlugin,
    EpsGreedySamplePlugin,
    GaussianSamplePlugin,
    GradPlugin,
    HiddenStatePlugin,
    MultinomialSamplePlugin,
    create_plugin,
    register_plugin,
)
from .target import TargetUpdater

__all__ = [
    "Agent",
    "set_train_mode",
    "AgentPlugin",
    "ArgmaxSamplePlugin",
    "EpsGreedySamplePlugin",
    "MultinomialSamplePlugin",
    "GradPlugin",
    "HiddenStatePlugin",
    "PLUGIN_REGISTRY",
    "GaussianSamplePlugin",
    "GaussianNoisePlugin",
    "OUNoisePlugin",
    "ColoredGaussianSamplePlugin",
    "NoiseProcess",
    "AR1Noise",
    "PinkNoise",
    "make_noise_process",
    "powerlaw_noise",
    "register_plugin",
    "create_plugin",
    "TargetUpdater",
]
