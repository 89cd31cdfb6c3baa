"""Models: plain ``nn.Module``s whose ``forward`` returns a dict; no RL state lives here."""

from typing import Any

import torch.nn as nn

from nervex.utils import MODEL_REGISTRY

from .agent_net import AgentNet
from .atoc import ATOC
from .coma import COMA, COMACritic
from .discrete_net import ConvDiscreteNet, FCDiscreteNet
from .drqn import DRQN
from .head import C51_N_ATOM, C51_V_MAX, C51_V_MIN, DiscreteHead, DistributionalHead
from .mappo import MAPPO
from .noisy import NoisyLinear, factorized_noise
from .qac import QAC, BatchedCritics
from .qmix import VDN, QMix, QMixer, VDNMixer
from .value_ac import ConvValueAC, ValueAC


def create_model(model_type: str, **kwargs: Any) -> nn.Module:
    """Build the model registered as ``model_type`` in ``MODEL_REGISTRY``.

    Args:
        model_type: e.g. ``'fc_discrete_net'`` or ``'conv_discrete_net'``.
        **kwargs: The model class's constructor arguments.

    Returns:
        The new model.

    Raises:
        KeyError: unknown ``model_type``; the message lists the registered names and the nearest match.
    """
    return MODEL_REGISTRY.build(model_type, **kwargs)


__all__ = [
    "AgentNet",
    "QMix",
    "QMixer",
    "VDN",
    "VDNMixer",
    "ATOC",
    "COMA",
    "COMACritic",
    "MAPPO",
    "FCDiscreteNet",
    "ConvDiscreteNet",
    "DRQN",
    "DiscreteHead",
    "DistributionalHead",
    "NoisyLinear",
    "factorized_noise",
    "C51_V_MIN",
    "C51_V_MAX",
    "C51_N_ATOM",
    "ValueAC",
    "ConvValueAC",
    "QAC",
    "BatchedCritics",
    "create_model",
]
