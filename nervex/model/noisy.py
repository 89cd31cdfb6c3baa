"""``NoisyLinear``: a linear layer with learned, factorized Gaussian parameter noise (Fortunato et al., 2017).

NoisyNet replaces epsilon-greedy exploration: the weights are ``mu + sigma * epsilon`` with learned ``mu`` and
``sigma``, so the network learns how much to explore, state by state. Rainbow (Hessel et al., 2018) uses it in every
fully connected layer of its head.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F


def factorized_noise(
    size: int,
    device: Optional[torch.device] = None,
    dtype: Optional[torch.dtype] = None,
    generator: Optional[torch.Generator] = None,
) -> torch.Tensor:
    """``f(x) = sign(x) * sqrt(|x|)`` of ``size`` standard-normal draws, the noise of factorized NoisyNets.

    ``E[f(x)] = 0`` and ``Var[f(x)] = E|x| = sqrt(2 / pi)``, so the product ``f(x_i) * f(y_j)`` of two independent
    draws has variance ``2 / pi``.

    Args:
        size: Number of draws.
        device: Device of the result.
        dtype: Floating dtype of the result.
        generator: Random generator (on ``device``); the global one when None.

    Returns:
        The transformed draws.

    Shapes:
        output: :math:`(size,)`
    """
    x = torch.randn(size, device=device, dtype=dtype, generator=generator)
    return x.sign().mul_(x.abs().sqrt_())


class NoisyLinear(nn.Module):
    """A linear layer with learned factorized Gaussian noise on its weights and bias.

    ``y = x W^T + b`` with ``W = mu_W + sigma_W * outer(eps_out, eps_in)`` and ``b = mu_b + sigma_b * eps_out``.
    Factorized Gaussian noise: ``eps_in = f(randn(in_features))``, ``eps_out = f(randn(out_features))`` with
    ``f(x) = sign(x) sqrt(|x|)`` (:func:`factorized_noise`), so one sample costs ``in + out`` draws and one outer
    product instead of ``in * out`` draws. Initialisation as in the paper's factorized case: ``mu`` uniform in
    ``+-1/sqrt(in_features)``, ``sigma = sigma_init / sqrt(in_features)`` for weights and biases alike.

    In training mode every ``forward`` draws new noise (two forwards on the same input differ, and an online and a
    target network evaluated in one learner step get independent noise); in eval mode there is no noise at all and
    the layer is the linear map of ``mu``. The noise of the last draw is kept in the buffers ``eps_in`` and
    ``eps_out``; they are not persistent, so the state dict holds only the four learned tensors and loads into a
    layer of the same size whatever its noise.

    Args:
        in_features: Input width.
        out_features: Output width.
        sigma_init: ``sigma_0`` of the paper (0.5 for factorized noise); 0 starts the layer noiseless.
        device: Device of the parameters.
        dtype: Floating dtype of the parameters; the noise follows the parameters' device and dtype.

    Shapes:
        ``forward``: ``(..., in_features) -> (..., out_features)``.

    Example:
        >>> layer = NoisyLinear(4, 2)
        >>> x = torch.ones(1, 4)
        >>> bool((layer(x) != layer(x)).any())  # training mode: new noise each call
        True
        >>> layer.eval()(x).equal(torch.nn.functional.linear(x, layer.weight_mu, layer.bias_mu))
        True
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        sigma_init: float = 0.5,
        device: Optional[torch.device] = None,
        dtype: Optional[torch.dtype] = None,
    ) -> None:
        super().__init__()
        for name, value in (("in_features", in_features), ("out_features", out_features)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"NoisyLinear {name} must be a positive int, got {value!r}")
        if not float(sigma_init) >= 0.0:
            raise ValueError(f"NoisyLinear sigma_init must be >= 0, got {sigma_init!r}")
        self.in_features = in_features
        self.out_features = out_features
        self.sigma_init = float(sigma_init)
        factory = dict(device=device, dtype=dtype)
        self.weight_mu = nn.Parameter(torch.empty(out_features, in_features, **factory))
        self.weight_sigma = nn.Parameter(torch.empty(out_features, in_features, **factory))
        self.bias_mu = nn.Parameter(torch.empty(out_features, **factory))
        self.bias_sigma = nn.Parameter(torch.empty(out_features, **factory))
        # not persistent: the noise is not a learned quantity, and a checkpoint should not depend on when it was drawn
        self.register_buffer("eps_in", torch.zeros(in_features, **factory), persistent=False)
        self.register_buffer("eps_out", torch.zeros(out_features, **factory), persistent=False)
        self.reset_parameters()
        self.reset_noise()

    def reset_parameters(self) -> None:
        """Initialise ``mu`` uniform in ``+-1/sqrt(in_features)`` and ``sigma`` to ``sigma_init / sqrt(in_features)``."""
        bound = 1.0 / math.sqrt(self.in_features)
        with torch.no_grad():
            self.weight_mu.uniform_(-bound, bound)
            self.bias_mu.uniform_(-bound, bound)
            self.weight_sigma.fill_(self.sigma_init * bound)
            self.bias_sigma.fill_(self.sigma_init * bound)

    def reset_noise(self, generator: Optional[torch.Generator] = None) -> None:
        """Draw new factorized noise into ``eps_in`` and ``eps_out``.

        The buffers get new tensors rather than being overwritten in place: a graph built by an earlier forward
        (say on ``obs``, before a second forward on ``next_obs``) keeps the noise it was built with.

        Args:
            generator: Random generator on the layer's device; the global one when None.
        """
        factory = dict(device=self.weight_mu.device, dtype=self.weight_mu.dtype, generator=generator)
        self.eps_in = factorized_noise(self.in_features, **factory)
        self.eps_out = factorized_noise(self.out_features, **factory)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return F.linear(x, self.weight_mu, self.bias_mu)
        self.reset_noise()
        weight = torch.addcmul(self.weight_mu, self.weight_sigma, torch.outer(self.eps_out, self.eps_in))
        bias = torch.addcmul(self.bias_mu, self.bias_sigma, self.eps_out)
        return F.linear(x, weight, bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, sigma_init={self.sigma_init}"
