"""Q-networks for discrete actions: an MLP for vector observations and the Nature-DQN CNN for images."""

from __future__ import annotations

import math
from typing import Dict, Sequence, Tuple, Union

import torch
import torch.nn as nn

from nervex.torch_utils import MLP
from nervex.torch_utils.network import nature_cnn, pixels_to_float
from nervex.utils import MODEL_REGISTRY

from .head import DiscreteHead


def _as_shape(value: Union[int, Sequence[int]], arg: str) -> Tuple[int, ...]:
    shape = (int(value),) if isinstance(value, int) else tuple(int(v) for v in value)
    if not shape or any(v < 1 for v in shape):
        raise ValueError(f"{arg} must be a positive int or a sequence of positive ints, got {value!r}")
    return shape


def _check_trailing_shape(x: torch.Tensor, shape: Tuple[int, ...], model: str) -> None:
    if x.dim() <= len(shape) or tuple(x.shape[-len(shape) :]) != shape:
        raise ValueError(
            f"{model} expects input of shape (B, {', '.join(map(str, shape))}), got {tuple(x.shape)}; "
            "check the model's obs_dim / obs_shape against the env's observation space"
        )


class FCDiscreteNet(nn.Module):
    """An MLP Q-network: observation vector -> Q-value per action.

    Args:
        obs_dim: Observation size, or its shape (flattened).
        action_dim: Number of actions.
        hidden_sizes: Widths of the hidden layers.
        dueling: Use the dueling head, ``Q = V + A - mean_a(A)``.
        activation: Hidden-layer activation name (see ``nervex.torch_utils.get_activation``).

    Shapes:
        ``forward``: ``x`` ``(B, *obs_shape)`` -> ``{'logit': (B, action_dim)}``; extra leading dims are kept.
    """

    def __init__(
        self,
        obs_dim: Union[int, Sequence[int]],
        action_dim: int,
        hidden_sizes: Sequence[int] = (128, 128),
        dueling: bool = False,
        activation: str = "relu",
    ) -> None:
        super().__init__()
        self.obs_shape = _as_shape(obs_dim, "FCDiscreteNet obs_dim")
        self.encoder = MLP(math.prod(self.obs_shape), hidden_sizes, activation=activation)
        self.head = DiscreteHead(self.encoder.out_dim, action_dim, dueling)

    def forward(self, x: torch.Tensor) -> Dict[str, torch.Tensor]:
        """Q-values of every action.

        Args:
            x: Observations; integer inputs are cast to float without scaling.

        Returns:
            ``{'logit': Q-values}``.

        Shapes:
            ``x``: ``(B, *obs_shape)``; ``logit``: ``(B, action_dim)``.
        """
        _check_trailing_shape(x, self.obs_shape, "FCDiscreteNet")
        if not x.is_floating_point():
            x = x.float()
        x = x.flatten(start_dim=x.dim() - len(self.obs_shape))
        return {"logit": self.head(self.encoder(x))}


class ConvDiscreteNet(nn.Module):
    """The Nature-DQN Q-network (Mnih et al. 2015): three conv layers, one hidden FC layer, Q-value per action.

    Args:
        obs_shape: ``(C, H, W)``, e.g. ``(4, 84, 84)`` for four stacked Atari frames; H and W must be at least 36.
        action_dim: Number of actions.
        hidden_size: Width of the FC layer after the convolutions.
        dueling: Use the dueling head, ``Q = V + A - mean_a(A)``.

    Shapes:
        ``forward``: ``x`` ``(B, C, H, W)`` -> ``{'logit': (B, action_dim)}``.
    """

    def __init__(
        self, obs_shape: Sequence[int], action_dim: int, hidden_size: int = 512, dueling: bool = False
    ) -> None:
        super().__init__()
        self.obs_shape = _as_shape(obs_shape, "ConvDiscreteNet obs_shape")
        if len(self.obs_shape) != 3:
            raise ValueError(f"ConvDiscreteNet obs_shape must be (C, H, W), got {tuple(obs_shape)}")
        self.encoder = nature_cnn(self.obs_shape, int(hidden_size), owner="ConvDiscreteNet")
        self.head = DiscreteHead(int(hidden_size), action_dim, dueling)

    def forward(self, x: torch.Tensor) -> Dict[str, torch.Tensor]:
        """Q-values of every action.

        Args:
            x: Images; ``uint8`` pixels are scaled to ``[0, 1]``, float inputs are used as they are.

        Returns:
            ``{'logit': Q-values}``.

        Shapes:
            ``x``: ``(B, C, H, W)``; ``logit``: ``(B, action_dim)``.
        """
        _check_trailing_shape(x, self.obs_shape, "ConvDiscreteNet")
        x = pixels_to_float(x)
        leading = x.shape[:-3]
        logit = self.head(self.encoder(x.reshape(-1, *self.obs_shape)))
        return {"logit": logit.reshape(*leading, -1)}


MODEL_REGISTRY.register("fc_discrete_net", FCDiscreteNet)
MODEL_REGISTRY.register("conv_discrete_net", ConvDiscreteNet)
