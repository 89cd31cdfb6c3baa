"""Q-networks for discrete actions: an MLP for vector observations and the Nature-DQN CNN for images."""

from __future__ import annotations

import math
from typing import Dict, Sequence, Tuple, Union

import torch
import torch.nn as nn

from nervex.torch_utils import MLP
from nervex.torch_utils.network import nature_cnn, pixels_to_float
from nervex.utils import MODEL_REGISTRY

from .head import C51_N_ATOM, C51_V_MAX, C51_V_MIN, discrete_q_head


def _as_shape(value: Union[int, Sequence[int]], arg: str) -> Tuple[int, ...]:
    shape = (int(value),) if isinstance(value, int) else tuple(int(v) for v in value)
    if not shape or any(v < 1 for v in shape):
        raise ValueError(f"{arg} must be a positive int or a sequence of positive ints, got {value!r}")
    return shape


def _q_output(head_out: Union[torch.Tensor, Dict[str, torch.Tensor]]) -> Dict[str, torch.Tensor]:
    # DiscreteHead gives the Q-values, DistributionalHead its dict (logit, distribution, log_distribution)
    return head_out if isinstance(head_out, dict) else {"logit": head_out}


def _check_trailing_shape(x: torch.Tensor, shape: Tuple[int, ...], model: str) -> None:
    if x.dim() <= len(shape) or tuple(x.shape[-len(shape) :]) != shape:
        raise ValueError(
            f"{model} expects input of shape (B, {', '.join(map(str, shape))}), got {tuple(x.shape)}; "
            "check the model's obs_dim / obs_shape against the env's observation space"
        )


class FCDiscreteNet(nn.Module):
    """An MLP Q-network: observation vector -> Q-value per action.

    With ``dueling``, ``distributional`` and ``noisy`` together this is Rainbow's network (on an MLP torso).

    Args:
        obs_dim: Observation size, or its shape (flattened).
        action_dim: Number of actions.
        hidden_sizes: Widths of the hidden layers.
        dueling: Use the dueling head, ``Q = V + A - mean_a(A)`` (per atom when ``distributional``).
        activation: Hidden-layer activation name (see ``nervex.torch_utils.get_activation``).
        distributional: Use the C51 head (:class:`~nervex.model.head.DistributionalHead`): ``logit`` is then the
            expected return, and ``distribution`` / ``log_distribution`` come with it.
        noisy: Build the head's layers as :class:`~nervex.model.noisy.NoisyLinear` (the hidden layers stay plain).
        n_atom: Atoms of the distributional head's support; only with ``distributional``.
        v_min: Lowest atom; only with ``distributional``.
        v_max: Highest atom; only with ``distributional``.

    Shapes:
        ``forward``: ``x`` ``(B, *obs_shape)`` -> ``{'logit': (B, action_dim)}``, with ``distributional`` also
        ``distribution`` and ``log_distribution`` ``(B, action_dim, n_atom)``; extra leading dims are kept.
    """

    def __init__(
        self,
        obs_dim: Union[int, Sequence[int]],
        action_dim: int,
        hidden_sizes: Sequence[int] = (128, 128),
        dueling: bool = False,
        activation: str = "relu",
        distributional: bool = False,
        noisy: bool = False,
        n_atom: int = C51_N_ATOM,
        v_min: float = C51_V_MIN,
        v_max: float = C51_V_MAX,
    ) -> None:
        super().__init__()
        self.obs_shape = _as_shape(obs_dim, "FCDiscreteNet obs_dim")
        self.encoder = MLP(math.prod(self.obs_shape), hidden_sizes, activation=activation)
        self.head = discrete_q_head(
            self.encoder.out_dim, action_dim, dueling, noisy, distributional, n_atom, v_min, v_max, "FCDiscreteNet"
        )

    def forward(self, x: torch.Tensor) -> Dict[str, torch.Tensor]:
        """Q-values of every action.

        Args:
            x: Observations; integer inputs are cast to float without scaling.

        Returns:
            ``{'logit': Q-values}``, plus ``distribution`` and ``log_distribution`` with ``distributional``.

        Shapes:
            ``x``: ``(B, *obs_shape)``; ``logit``: ``(B, action_dim)``; ``distribution``, ``log_distribution``:
            ``(B, action_dim, n_atom)``.
        """
        _check_trailing_shape(x, self.obs_shape, "FCDiscreteNet")
        if not x.is_floating_point():
            x = x.float()
        x = x.flatten(start_dim=x.dim() - len(self.obs_shape))
        return _q_output(self.head(self.encoder(x)))


class ConvDiscreteNet(nn.Module):
    """The Nature-DQN Q-network (Mnih et al. 2015): three conv layers, one hidden FC layer, Q-value per action.

    Args:
        obs_shape: ``(C, H, W)``, e.g. ``(4, 84, 84)`` for four stacked Atari frames; H and W must be at least 36.
        action_dim: Number of actions.
        hidden_size: Width of the FC layer after the convolutions.
        dueling: Use the dueling head, ``Q = V + A - mean_a(A)`` (per atom when ``distributional``).
        distributional: Use the C51 head (see :class:`FCDiscreteNet`).
        noisy: Build the head's layers as :class:`~nervex.model.noisy.NoisyLinear`; the encoder's FC layer stays
            plain (Rainbow also makes that one noisy, with separate value and advantage streams).
        n_atom: Atoms of the distributional head's support; only with ``distributional``.
        v_min: Lowest atom; only with ``distributional``.
        v_max: Highest atom; only with ``distributional``.

    Shapes:
        ``forward``: ``x`` ``(B, C, H, W)`` -> ``{'logit': (B, action_dim)}``, with ``distributional`` also
        ``distribution`` and ``log_distribution`` ``(B, action_dim, n_atom)``.
    """

    def __init__(
        self,
        obs_shape: Sequence[int],
        action_dim: int,
        hidden_size: int = 512,
        dueling: bool = False,
        distributional: bool = False,
        noisy: bool = False,
        n_atom: int = C51_N_ATOM,
        v_min: float = C51_V_MIN,
        v_max: float = C51_V_MAX,
    ) -> None:
        super().__init__()
        self.obs_shape = _as_shape(obs_shape, "ConvDiscreteNet obs_shape")
        if len(self.obs_shape) != 3:
            raise ValueError(f"ConvDiscreteNet obs_shape must be (C, H, W), got {tuple(obs_shape)}")
        self.encoder = nature_cnn(self.obs_shape, int(hidden_size), owner="ConvDiscreteNet")
        self.head = discrete_q_head(
            int(hidden_size), action_dim, dueling, noisy, distributional, n_atom, v_min, v_max, "ConvDiscreteNet"
        )

    def forward(self, x: torch.Tensor) -> Dict[str, torch.Tensor]:
        """Q-values of every action.

        Args:
            x: Images; ``uint8`` pixels are scaled to ``[0, 1]``, float inputs are used as they are.

        Returns:
            ``{'logit': Q-values}``, plus ``distribution`` and ``log_distribution`` with ``distributional``.

        Shapes:
            ``x``: ``(B, C, H, W)``; ``logit``: ``(B, action_dim)``; ``distribution``, ``log_distribution``:
            ``(B, action_dim, n_atom)``.
        """
        _check_trailing_shape(x, self.obs_shape, "ConvDiscreteNet")
        x = pixels_to_float(x)
        leading = x.shape[:-3]
        features = self.encoder(x.reshape(-1, *self.obs_shape))
        return _q_output(self.head(features.reshape(*leading, features.shape[-1])))


MODEL_REGISTRY.register("fc_discrete_net", FCDiscreteNet)
MODEL_REGISTRY.register("conv_discrete_net", ConvDiscreteNet)
