"""PPO's clipped surrogate loss (Schulman et al., 2017), with optional value clipping and dual clip (Ye et al., 2020).

Distribution-agnostic: the policy computes log-probabilities of the taken actions (categorical or Gaussian, see
``nervex.torch_utils.distribution``), so one function serves discrete and continuous actions. The terms are returned
apart and combined by the policy as ``policy_loss + vf_coef * value_loss + ent_coef * entropy_loss``
(Stable-Baselines3's convention: no 0.5 on the value term, ``entropy_loss = -entropy``).
"""

from __future__ import annotations

from collections import namedtuple
from typing import Optional, Tuple

import torch

from .a2c import check_same_shape, entropy_term
from .td import weighted_mean

ppo_data = namedtuple(
    "ppo_data", ["logp_new", "logp_old", "entropy", "value_new", "value_old", "adv", "return_", "weight"]
)
ppo_loss = namedtuple("ppo_loss", ["policy_loss", "value_loss", "entropy_loss"])
ppo_info = namedtuple("ppo_info", ["approx_kl", "clip_fraction"])


def _check_ratios(clip_ratio: float, value_clip_ratio: Optional[float], dual_clip: Optional[float]) -> None:
    # 0 is allowed: a linear clip schedule reaches it at the end of training (the ratio is then clipped at 1)
    if not clip_ratio >= 0:
        raise ValueError(f"ppo_error: clip_ratio must be >= 0, got {clip_ratio}")
    if value_clip_ratio is not None and not value_clip_ratio > 0:
        raise ValueError(f"ppo_error: value_clip_ratio must be > 0 or None (no value clipping), got {value_clip_ratio}")
    if dual_clip is not None and not dual_clip > 1:
        raise ValueError(f"ppo_error: dual_clip must be > 1 or None (no dual clip), got {dual_clip}")


def ppo_policy_objective(
    ratio: torch.Tensor, adv: torch.Tensor, clip_ratio: float, dual_clip: Optional[float] = None
) -> torch.Tensor:
    """Per-sample clipped surrogate objective (to be maximized).

    ``min(ratio * adv, clip(ratio, 1 - clip_ratio, 1 + clip_ratio) * adv)``; with ``dual_clip = c``, samples with
    ``adv < 0`` take ``max(that, c * adv)``, which bounds the loss of a very large ratio on a bad action.

    Shapes:
        - ratio, adv: any common shape; output: the same
    """
    surrogate = ratio * adv
    clipped = ratio.clamp(1.0 - clip_ratio, 1.0 + clip_ratio) * adv
    objective = torch.min(surrogate, clipped)
    if dual_clip is not None:
        objective = torch.where(adv < 0, torch.max(objective, dual_clip * adv), objective)
    return objective


def ppo_error(
    data: ppo_data,
    clip_ratio: float = 0.2,
    value_clip_ratio: Optional[float] = None,
    dual_clip: Optional[float] = None,
) -> Tuple[ppo_loss, ppo_info]:
    """PPO's policy, value and entropy losses and two diagnostics.

    With ``ratio = exp(logp_new - logp_old)`` and ``mean_w(x) = mean(weight * x)`` (``mean(x)`` without weights):

    - ``policy_loss = -mean_w(ppo_policy_objective(ratio, adv, clip_ratio, dual_clip))``;
    - ``value_loss = mean_w((value_new - return_)^2)``, or with ``value_clip_ratio = eps`` (OpenAI baselines)
      ``mean_w(max((value_new - return_)^2, (v_clip - return_)^2))`` where
      ``v_clip = value_old + clamp(value_new - value_old, -eps, eps)``;
    - ``entropy_loss = -mean_w(entropy)``, a zero scalar when ``entropy`` is ``None``;
    - ``approx_kl = mean((ratio - 1) - log(ratio))``, the unbiased, non-negative estimator of ``KL(old || new)``
      used by SB3 and CleanRL, and ``clip_fraction = mean(|ratio - 1| > clip_ratio)``; both unweighted.

    Args:
        data: ``ppo_data(logp_new, logp_old, entropy, value_new, value_old, adv, return_, weight)``. ``logp_old``,
            ``value_old``, ``adv`` and ``return_`` come from the rollout and are treated as constants (detached).
            ``entropy``, ``weight`` and (without value clipping) ``value_old`` may be ``None``. Advantage
            normalization, if wanted, is the caller's (it depends on the minibatch).
        clip_ratio: The surrogate's clip range ``eps``: ratios are clipped to ``[1 - eps, 1 + eps]``.
        value_clip_ratio: Clip range of the value update around ``value_old``; ``None``: no value clipping.
        dual_clip: The ``c > 1`` of dual-clip PPO; ``None``: off.

    Returns:
        ``(ppo_loss(policy_loss, value_loss, entropy_loss), ppo_info(approx_kl, clip_fraction))``: scalar losses,
        and the diagnostics as detached 0-dim tensors (not Python floats), so a caller on an accelerator chooses when
        to pay the device sync of ``.item()``.

    Shapes:
        - logp_new, logp_old, entropy, value_new, value_old, adv, return_, weight: :math:`(B,)`, or any common shape
          such as :math:`(T, B)`
        - output: scalars

    Raises:
        ValueError: a field's shape differs from ``logp_new``'s; ``value_old`` is missing with value clipping;
            ``clip_ratio <= 0``, ``value_clip_ratio <= 0`` or ``dual_clip <= 1``.
    """
    _check_ratios(clip_ratio, value_clip_ratio, dual_clip)
    logp_new, logp_old, entropy, value_new, value_old, adv, return_, weight = data
    fields = dict(logp_old=logp_old, entropy=entropy, value_new=value_new, value_old=value_old, adv=adv)
    check_same_shape("ppo_error", "logp_new", tuple(logp_new.shape), **fields, return_=return_, weight=weight)
    adv, return_ = adv.detach(), return_.detach()

    log_ratio = logp_new - logp_old.detach()
    ratio = log_ratio.exp()
    policy_loss = -weighted_mean(ppo_policy_objective(ratio, adv, clip_ratio, dual_clip), weight)

    value_error = (value_new - return_).square()
    if value_clip_ratio is not None:
        if value_old is None:
            raise ValueError("ppo_error: value_clip_ratio is set but value_old is None; pass the rollout's values")
        value_old = value_old.detach()
        value_clipped = value_old + (value_new - value_old).clamp(-value_clip_ratio, value_clip_ratio)
        value_error = torch.max(value_error, (value_clipped - return_).square())
    value_loss = weighted_mean(value_error, weight)

    with torch.no_grad():
        approx_kl = ((ratio - 1.0) - log_ratio).mean()
        clip_fraction = ((ratio - 1.0).abs() > clip_ratio).to(ratio.dtype).mean()
    losses = ppo_loss(policy_loss, value_loss, entropy_term(entropy, weight, logp_new))
    return losses, ppo_info(approx_kl, clip_fraction)
