"""Small network building blocks shared by the models: activations by name, fc / conv blocks and an MLP."""

from __future__ import annotations

import difflib
from typing import Callable, Dict, Optional, Sequence, Union

import torch
import torch.nn as nn

ACTIVATIONS: Dict[str, Callable[[], nn.Module]] = {
    "relu": nn.ReLU,
    "leaky_relu": nn.LeakyReLU,
    "elu": nn.ELU,
    "gelu": nn.GELU,
    "silu": nn.SiLU,
    "swish": nn.SiLU,
    "tanh": nn.Tanh,
    "sigmoid": nn.Sigmoid,
    "softplus": nn.Softplus,
    "identity": nn.Identity,
}


def get_activation(name: str) -> nn.Module:
    """Build the activation module called ``name``.

    Args:
        name: One of ``ACTIVATIONS`` (``'relu'``, ``'tanh'``, ``'gelu'``...), case-insensitive.

    Returns:
        A new activation module.

    Raises:
        ValueError: unknown name; the message lists the valid names and the nearest match.
    """
    key = str(name).lower()
    if key not in ACTIVATIONS:
        close = difflib.get_close_matches(key, list(ACTIVATIONS), n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise ValueError(f"unknown activation '{name}'; valid: {', '.join(ACTIVATIONS)}{hint}")
    return ACTIVATIONS[key]()


def fc_block(in_dim: int, out_dim: int, activation: Optional[str] = "relu", layer_norm: bool = False) -> nn.Sequential:
    """A linear layer, optionally followed by LayerNorm and an activation.

    Args:
        in_dim: Input features.
        out_dim: Output features.
        activation: Activation name (see ``get_activation``), or None for none.
        layer_norm: Put a LayerNorm between the linear layer and the activation.

    Returns:
        ``nn.Sequential(Linear[, LayerNorm][, activation])``.

    Shapes:
        ``(..., in_dim) -> (..., out_dim)``.
    """
    layers = [nn.Linear(in_dim, out_dim)]
    if layer_norm:
        layers.append(nn.LayerNorm(out_dim))
    if activation is not None:
        layers.append(get_activation(activation))
    return nn.Sequential(*layers)


def conv2d_block(
    in_channels: int,
    out_channels: int,
    kernel_size: Union[int, Sequence[int]],
    stride: Union[int, Sequence[int]] = 1,
    padding: Union[int, Sequence[int], str] = 0,
    activation: Optional[str] = "relu",
) -> nn.Sequential:
    """A 2-D convolution, optionally followed by an activation.

    Args:
        in_channels: Input channels.
        out_channels: Output channels.
        kernel_size, stride, padding: As for ``nn.Conv2d``.
        activation: Activation name (see ``get_activation``), or None for none.

    Returns:
        ``nn.Sequential(Conv2d[, activation])``.

    Shapes:
        ``(B, in_channels, H, W) -> (B, out_channels, H', W')`` with ``H' = (H + 2 * padding - kernel) // stride + 1``.
    """
    layers = [nn.Conv2d(in_channels, out_channels, kernel_size, stride=stride, padding=padding)]
    if activation is not None:
        layers.append(get_activation(activation))
    return nn.Sequential(*layers)


class MLP(nn.Module):
    """Fully connected layers with an activation after each hidden layer and a linear output layer.

    Args:
        in_dim: Input features.
        hidden_sizes: Width of each hidden layer; may be empty.
        out_dim: Width of a final linear layer without activation; None ends with the last hidden layer (activated).
        activation: Activation name for the hidden layers (see ``get_activation``).
        layer_norm: Put a LayerNorm before each hidden activation.

    Attributes:
        out_dim: The width of the output (``in_dim`` when there are no layers at all).

    Shapes:
        ``forward``: ``(..., in_dim) -> (..., out_dim)``.
    """

    def __init__(
        self,
        in_dim: int,
        hidden_sizes: Sequence[int],
        out_dim: Optional[int] = None,
        activation: str = "relu",
        layer_norm: bool = False,
    ) -> None:
        super().__init__()
        if isinstance(hidden_sizes, int):
            raise TypeError(f"MLP hidden_sizes must be a sequence of ints, e.g. [{hidden_sizes}], got {hidden_sizes}")
        get_activation(activation)  # fail on a bad name even when there are no hidden layers
        layers = []
        width = int(in_dim)
        for size in hidden_sizes:
            layers.append(fc_block(width, int(size), activation, layer_norm))
            width = int(size)
        if out_dim is not None:
            layers.append(nn.Linear(width, int(out_dim)))
            width = int(out_dim)
        self.layers = nn.Sequential(*layers)
        self.out_dim = width

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)
