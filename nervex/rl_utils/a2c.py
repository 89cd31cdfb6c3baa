"""Advantage actor-critic loss (Mnih et al., 2016), distribution-agnostic: the policy passes log-probabilities.

The three terms are returned apart; the policy combines them as
``policy_loss + vf_coef * value_loss + ent_coef * entropy_loss`` (Stable-Baselines3's convention: no 0.5 on the value
term, and ``entropy_loss = -entropy`` so that minimizing it maximizes entropy).
"""

from __future__ import annotations

from collections import namedtuple
from typing import Tuple

import torch

from .td import weighted_mean

a2c_data = namedtuple("a2c_data", ["logp", "entropy", "value", "adv", "return_", "weight"])
a2c_loss = namedtuple("a2c_loss", ["policy_loss", "value_loss", "entropy_loss"])


def check_same_shape(fn_name: str, reference: str, shape: Tuple[int, ...], **tensors: torch.Tensor | None) -> None:
    """Raise ``ValueError`` unless every given tensor (``None`` skipped) has shape ``shape``.

    Broadcasting a ``(B, 1)`` value head against ``(B,)`` returns into a ``(B, B)`` loss is the bug this catches.

    Args:
        fn_name: Name of the calling function, for the message.
        reference: Name of the field ``shape`` was taken from.
        shape: The expected per-sample shape.
        **tensors: The fields to check, by name.

    Raises:
        ValueError: a tensor of another shape; the message names it and the expected shape.
    """
    for name, tensor in tensors.items():
        if tensor is not None and tuple(tensor.shape) != shape:
            hint = " (squeeze(-1) it)" if tuple(tensor.shape) == shape + (1,) else ""
            raise ValueError(
                f"{fn_name}: {name} has shape {tuple(tensor.shape)} but {reference} has shape {shape}; every "
                f"per-sample field must be {shape}{hint}"
            )


def entropy_term(entropy: torch.Tensor | None, weight: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    """``-mean_w(entropy)``, or a zero scalar (of ``like``'s dtype and device) when ``entropy`` is ``None``.

    Shapes:
        - entropy, weight: :math:`(B,)` or ``None``
        - like: any tensor
        - output: scalar
    """
    if entropy is None:
        return torch.zeros((), dtype=like.dtype, device=like.device)
    return -weighted_mean(entropy, weight)


def a2c_error(data: a2c_data) -> a2c_loss:
    """A2C's policy-gradient, value and entropy losses.

    - ``policy_loss = -mean_w(adv * logp)``, with ``adv`` detached: advantages are constants of the gradient;
    - ``value_loss = mean_w((value - return_)^2)``;
    - ``entropy_loss = -mean_w(entropy)`` (0 when ``entropy`` is ``None``).

    ``mean_w(x)`` is ``mean(weight * x)``, or ``mean(x)`` when ``weight`` is ``None``.

    Args:
        data: ``a2c_data(logp, entropy, value, adv, return_, weight)``: log-probabilities of the taken actions under
            the current policy (from :class:`~nervex.torch_utils.CategoricalDist` or
            :class:`~nervex.torch_utils.GaussianDist`), their entropies (or ``None``), value estimates, advantages,
            value targets (e.g. ``adv + value`` from GAE, detached) and per-sample weights (or ``None``).

    Returns:
        ``a2c_loss(policy_loss, value_loss, entropy_loss)``, each a scalar.

    Shapes:
        - logp, entropy, value, adv, return_, weight: :math:`(B,)`, or any common shape such as :math:`(T, B)`
        - output: three scalars

    Raises:
        ValueError: a field's shape differs from ``logp``'s.
    """
    logp, entropy, value, adv, return_, weight = data
    shape = tuple(logp.shape)
    check_same_shape("a2c_error", "logp", shape, entropy=entropy, value=value, adv=adv, return_=return_, weight=weight)
    policy_loss = -weighted_mean(adv.detach() * logp, weight)
    value_loss = weighted_mean((value - return_).square(), weight)
    return a2c_loss(policy_loss, value_loss, entropy_term(entropy, weight, logp))
