"""Small network building blocks shared by the models: activations by name, fc / conv blocks and an MLP."""

from __future__ import annotations

import difflib
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn

from .fused_mlp import FUSED_ACTIVATIONS, mlps_forward_params
from .module_watch import ModuleWatch

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
        # With a tanh or relu and no LayerNorm, the layers run as one autograd node (fused_mlp): for the small
        # networks of RL, nn.Module calls and per-layer autograd nodes cost more than the matmuls.
        self._fused: Optional[List[Tuple[nn.Linear, Optional[str]]]] = None
        self._params: Tuple[Tuple[Optional[str], ...], List[torch.Tensor]] = ((), [])
        if (
            not layer_norm
            and activation in FUSED_ACTIVATIONS
            and all(isinstance(block, (nn.Sequential, nn.Linear)) for block in layers)
        ):
            self._fused = [
                (block[0], activation) if isinstance(block, nn.Sequential) else (block, None) for block in layers
            ]
        # see fused_params: it reads the planned layers' weights and biases
        self._params_watch = ModuleWatch([linear for linear, _ in self._fused or []], False, ("_parameters",))

    def fused_params(self) -> Optional[Tuple[Tuple[Optional[str], ...], List[torch.Tensor]]]:
        """``((activation per layer), [weight, bias, ...])`` when the MLP runs fused (``relu`` or ``tanh``, no
        LayerNorm), else None; cached (reading each ``nn.Linear``'s tensors per call costs ~8 us) until a layer's
        weight or bias is replaced."""
        if not self._fused:
            return None
        if self._params_watch.replaced():
            plan = self._fused
            self._params = (tuple(act for _, act in plan), [t for lin, _ in plan for t in (lin.weight, lin.bias)])
        return self._params

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._fused is None or not self._fused or torch.jit.is_scripting():
            return self.layers(x)
        acts, weights = self.fused_params()  # type: ignore[misc]  (not None: the MLP runs fused)
        return mlps_forward_params(x, (acts,), weights)[0]


def init_orthogonal_(module: nn.Module, gain: float = 1.0) -> nn.Module:
    """Orthogonal weights scaled by ``gain`` and zero biases for every linear and conv layer in ``module``, in place.

    The initialisation of PPO / A2C in OpenAI Baselines and Stable-Baselines3 (``gain=sqrt(2)`` for hidden layers,
    0.01 for the policy output, 1 for the value output). Other parameters (norms, free ``log_std``) are left alone.

    Args:
        module: A layer or a module holding layers.
        gain: Scale of the orthogonal matrix: a weight viewed as ``(out, in)`` has ``W W^T = gain^2 I`` when
            ``out <= in`` and ``W^T W = gain^2 I`` otherwise.

    Returns:
        ``module``, for chaining.
    """
    for layer in module.modules():
        if isinstance(layer, (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)):
            nn.init.orthogonal_(layer.weight, gain=gain)
            if layer.bias is not None:
                nn.init.zeros_(layer.bias)
    return module


NATURE_CNN_MIN_SIZE = 36


def _nature_conv_out(size: int) -> int:
    for kernel, stride in ((8, 4), (4, 2), (3, 1)):
        size = (size - kernel) // stride + 1
    return size


def pixels_to_float(x: torch.Tensor) -> torch.Tensor:
    """``uint8`` pixels scaled to ``[0, 1]``; other integers cast to float; float inputs as they are.

    Frames stay ``uint8`` in replay and rollouts (4x smaller) and are scaled here, on the model's device, after the
    transfer.
    """
    if x.dtype == torch.uint8:
        return x.float().mul_(1.0 / 255.0)
    return x if x.is_floating_point() else x.float()


def nature_cnn(obs_shape: Sequence[int], hidden_size: int = 512, owner: str = "nature_cnn") -> nn.Sequential:
    """The Nature-DQN encoder (Mnih et al. 2015): conv 32 8x8/4, conv 64 4x4/2, conv 64 3x3/1, one FC layer, all ReLU.

    The same trunk as Stable-Baselines3's ``NatureCNN``; it expects floats (scale ``uint8`` pixels before it).

    Args:
        obs_shape: ``(C, H, W)``; H and W must be at least ``NATURE_CNN_MIN_SIZE`` (36).
        hidden_size: Width of the FC layer after the convolutions (the feature size).
        owner: Name of the model building it, for error messages.

    Returns:
        ``nn.Sequential(conv, conv, conv, Flatten, fc)``.

    Raises:
        ValueError: ``obs_shape`` is not three-dimensional or too small for the kernels.

    Shapes:
        ``(B, C, H, W) -> (B, hidden_size)``.
    """
    if len(obs_shape) != 3:
        raise ValueError(f"{owner} obs_shape must be (C, H, W), got {tuple(obs_shape)}")
    channels, height, width = (int(v) for v in obs_shape)
    out_h, out_w = _nature_conv_out(height), _nature_conv_out(width)
    if out_h < 1 or out_w < 1:
        raise ValueError(
            f"{owner} obs_shape {tuple(obs_shape)} is too small for the 8x8/4, 4x4/2, 3x3/1 encoder; "
            f"H and W must be at least {NATURE_CNN_MIN_SIZE}"
        )
    return nn.Sequential(
        conv2d_block(channels, 32, 8, stride=4),
        conv2d_block(32, 64, 4, stride=2),
        conv2d_block(64, 64, 3, stride=1),
        nn.Flatten(),
        fc_block(64 * out_h * out_w, int(hidden_size)),
    )
