"""Targets and losses of the off-policy actor-critics for continuous actions: DDPG, TD3 and SAC.

Conventions are those of ``td.py``:

- ``terminated`` is the only thing that cuts bootstrapping; a window cut short by a time-limit truncation still
  bootstraps, with the per-sample discount ``value_gamma`` (``gamma ** k`` for a window of ``k`` steps, from
  ``Adder.get_nstep_return_data(..., gamma=...)``); ``None`` means ``gamma ** nstep`` for every sample.
- n-step rewards are laid out ``(nstep, B)``, time first.
- Critic values of ``N`` critics are laid out ``(N, B)`` (one row per critic, as ``QAC`` returns them).
- Targets are computed without gradient; ``weight`` is the importance weight of prioritized replay (``None``: ones).

SAC's n-step target adds the entropy bonus of the bootstrap state only (``- alpha * log pi(a'|s')``), not of the
states inside the window: the behaviour actions there were taken in the past and their log-probabilities under the
current policy are not stored.
"""

from __future__ import annotations

from typing import Optional, Tuple, Union

import torch

from .td import check_batch, check_nstep_reward, nstep_return, weighted_mean

Bound = Union[torch.Tensor, float]


def _as_critics(q: torch.Tensor, fn_name: str) -> torch.Tensor:
    """``q`` as ``(N, B)``: a ``(B,)`` tensor is one critic."""
    if q.dim() == 1:
        return q.unsqueeze(0)
    if q.dim() != 2:
        raise ValueError(f"{fn_name}: critic values have shape {tuple(q.shape)}; expected (N, B) or (B,)")
    return q


def critic_min(q: torch.Tensor) -> torch.Tensor:
    """The smallest of ``N`` critics' values per sample (TD3's clipped double Q; the identity for one critic).

    Shapes:
        - q: :math:`(N, B)` or :math:`(B,)`
        - output: :math:`(B,)`
    """
    return _as_critics(q, "critic_min").min(dim=0).values


def bootstrap_target(
    next_value: torch.Tensor,
    reward: torch.Tensor,
    terminated: torch.Tensor,
    gamma: float,
    nstep: int = 1,
    value_gamma: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """The n-step target ``sum_k gamma^k r_k + bootstrap_gamma * (1 - terminated) * next_value``.

    Args:
        next_value: The value of the window's last next state (already reduced over critics, entropy included).
        reward: The window's rewards, zero after an episode's end.
        terminated: Whether the window ended in a terminal state (a truncation is *not* terminal).
        gamma: Discount factor.
        nstep: Window length.
        value_gamma: Per-sample bootstrap discount; ``None`` uses ``gamma ** nstep``.

    Returns:
        The detached target per sample.

    Shapes:
        - next_value, terminated, value_gamma: :math:`(B,)`
        - reward: :math:`(nstep, B)`
        - output: :math:`(B,)`

    Raises:
        ValueError: ``reward`` is not ``(nstep, B)`` or a per-sample tensor is not ``(B,)``.
    """
    batch = next_value.shape[0]
    check_batch("bootstrap_target", batch, terminated=terminated, value_gamma=value_gamma)
    check_nstep_reward("bootstrap_target", reward, nstep, batch)
    with torch.no_grad():
        dtype = next_value.dtype
        not_terminal = 1.0 - terminated.to(dtype)
        reward_sum = nstep_return(reward.to(dtype), gamma, nstep, "bootstrap_target")
        if value_gamma is None:
            return torch.addcmul(reward_sum, not_terminal, next_value, value=gamma**nstep)
        return torch.addcmul(reward_sum, value_gamma.to(dtype) * not_terminal, next_value)


def ddpg_critic_target(
    target_q: torch.Tensor,
    reward: torch.Tensor,
    terminated: torch.Tensor,
    gamma: float,
    nstep: int = 1,
    value_gamma: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """DDPG's target ``sum_k gamma^k r_k + bootstrap_gamma * (1 - terminated) * Q'(s', mu'(s'))``.

    Args:
        target_q: The target critic's value of the target actor's action in the bootstrap state.
        reward, terminated, gamma, nstep, value_gamma: See :func:`bootstrap_target`.

    Returns:
        The detached target.

    Shapes:
        - target_q: :math:`(B,)` or :math:`(1, B)`
        - reward: :math:`(nstep, B)`; terminated, value_gamma: :math:`(B,)`
        - output: :math:`(B,)`
    """
    q = _as_critics(target_q, "ddpg_critic_target")
    if q.shape[0] != 1:
        raise ValueError(f"ddpg_critic_target: got {q.shape[0]} critics; DDPG has one (use td3_critic_target)")
    return bootstrap_target(q[0], reward, terminated, gamma, nstep, value_gamma)


def td3_critic_target(
    target_q: torch.Tensor,
    reward: torch.Tensor,
    terminated: torch.Tensor,
    gamma: float,
    nstep: int = 1,
    value_gamma: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """TD3's target with clipped double Q: the bootstrap value is the minimum over the target critics.

    The action the target critics value is the smoothed target action (:func:`target_policy_smoothing`).

    Shapes:
        - target_q: :math:`(N, B)`
        - reward: :math:`(nstep, B)`; terminated, value_gamma: :math:`(B,)`
        - output: :math:`(B,)`
    """
    return bootstrap_target(critic_min(target_q), reward, terminated, gamma, nstep, value_gamma)


def sac_critic_target(
    target_q: torch.Tensor,
    next_log_prob: torch.Tensor,
    alpha: Union[torch.Tensor, float],
    reward: torch.Tensor,
    terminated: torch.Tensor,
    gamma: float,
    nstep: int = 1,
    value_gamma: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """SAC's soft target: bootstrap value ``min_i Q'_i(s', a') - alpha * log pi(a'|s')`` with ``a' ~ pi(.|s')``.

    Args:
        target_q: The target critics' values of ``a'``.
        next_log_prob: ``log pi(a'|s')`` of the sampled ``a'`` (tanh correction included).
        alpha: The entropy temperature (a number or a 0-dim tensor; not differentiated here).
        reward, terminated, gamma, nstep, value_gamma: See :func:`bootstrap_target`.

    Returns:
        The detached target.

    Shapes:
        - target_q: :math:`(N, B)`; next_log_prob: :math:`(B,)`
        - reward: :math:`(nstep, B)`; terminated, value_gamma: :math:`(B,)`
        - output: :math:`(B,)`
    """
    q = critic_min(target_q)
    check_batch("sac_critic_target", q.shape[0], next_log_prob=next_log_prob)
    alpha = alpha.detach() if isinstance(alpha, torch.Tensor) else alpha
    return bootstrap_target(q - alpha * next_log_prob.detach(), reward, terminated, gamma, nstep, value_gamma)


def critic_loss(
    q: torch.Tensor, target: torch.Tensor, weight: Optional[torch.Tensor] = None
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Every critic regressed on one target: ``sum_i 0.5 * mean_b weight_b * (q_ib - target_b)^2`` (as SB3).

    Args:
        q: The online critics' values of the stored actions.
        target: The detached target.
        weight: Importance weights; ``None`` means ones.

    Returns:
        ``(loss, td_error)`` with ``td_error = mean_i |target - q_i|`` per sample (detached; replay priorities).

    Shapes:
        - q: :math:`(N, B)` or :math:`(B,)`
        - target, weight: :math:`(B,)`
        - output: scalar, :math:`(B,)`
    """
    q = _as_critics(q, "critic_loss")
    check_batch("critic_loss", q.shape[1], target=target, weight=weight)
    error = target.detach().unsqueeze(0) - q  # (N, B)
    per_sample = 0.5 * error.square().sum(0)
    return weighted_mean(per_sample, weight), error.detach().abs().mean(0)


def target_policy_smoothing(
    action: torch.Tensor, noise: torch.Tensor, noise_clip: Bound, low: Bound, high: Bound
) -> torch.Tensor:
    """TD3's target action: ``clip(mu'(s') + clip(noise, -noise_clip, noise_clip), low, high)``.

    Args:
        action: The target actor's action.
        noise: Drawn by the caller (``sigma * scale * N(0, 1)``, with ``scale = (high - low) / 2`` when ``sigma`` is
            given in the ``[-1, 1]`` action space, as SB3's ``target_policy_noise``).
        noise_clip: Largest absolute noise, a number or per dimension (same units as ``noise``).
        low, high: Action bounds, numbers or per dimension.

    Returns:
        The smoothed action inside ``[low, high]``.

    Shapes:
        - action, noise: :math:`(B, A)`
        - noise_clip, low, high: scalar or :math:`(A,)`
        - output: :math:`(B, A)`
    """
    if action.shape != noise.shape:
        raise ValueError(
            f"target_policy_smoothing: noise has shape {tuple(noise.shape)}; expected the action's {tuple(action.shape)}"
        )
    clip = torch.as_tensor(noise_clip, dtype=action.dtype, device=action.device)
    smoothed = action + torch.clamp(noise, -clip, clip)
    low = torch.as_tensor(low, dtype=action.dtype, device=action.device)
    high = torch.as_tensor(high, dtype=action.dtype, device=action.device)
    return smoothed.clamp_(low, high)


def deterministic_actor_loss(q: torch.Tensor, weight: Optional[torch.Tensor] = None) -> torch.Tensor:
    """DDPG's and TD3's actor loss ``-mean_b Q_1(s_b, mu(s_b))`` (the first critic only, as TD3 and SB3).

    Shapes:
        - q: :math:`(N, B)` or :math:`(B,)`
        - weight: :math:`(B,)` or ``None``
        - output: scalar
    """
    return weighted_mean(-_as_critics(q, "deterministic_actor_loss")[0], weight)


def sac_actor_loss(
    q: torch.Tensor, log_prob: torch.Tensor, alpha: Union[torch.Tensor, float], weight: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """SAC's actor loss ``mean_b [alpha * log pi(a_b|s_b) - min_i Q_i(s_b, a_b)]`` with reparameterized ``a_b``.

    Args:
        q: The critics' values of the actions just sampled (with gradient to the actor through the actions).
        log_prob: Their log-probabilities (tanh correction included), with gradient.
        alpha: The temperature (detached here: it has its own loss).
        weight: Importance weights; ``None`` means ones.

    Shapes:
        - q: :math:`(N, B)`; log_prob, weight: :math:`(B,)`
        - output: scalar
    """
    q = critic_min(q)
    check_batch("sac_actor_loss", q.shape[0], log_prob=log_prob, weight=weight)
    alpha = alpha.detach() if isinstance(alpha, torch.Tensor) else alpha
    return weighted_mean(alpha * log_prob - q, weight)


def sac_alpha_loss(log_alpha: torch.Tensor, log_prob: torch.Tensor, target_entropy: float) -> torch.Tensor:
    """The temperature loss ``-mean_b log_alpha * (log pi(a_b|s_b) + target_entropy)`` (SB3, Haarnoja et al. 2018).

    Its gradient in ``log_alpha`` is ``-mean(log_prob + target_entropy) = mean(entropy) - target_entropy`` with
    ``entropy ~ -log_prob``: when the policy's entropy is below the target the gradient is negative, so a gradient
    step raises alpha (more weight on entropy); above the target it lowers alpha.

    Args:
        log_alpha: The learned log-temperature (0-dim, requires grad).
        log_prob: Log-probabilities of fresh samples of the current policy (detached here).
        target_entropy: Usually ``-action_dim``.

    Shapes:
        - log_alpha: scalar
        - log_prob: :math:`(B,)`
        - output: scalar
    """
    return -(log_alpha * (log_prob.detach() + target_entropy)).mean()
