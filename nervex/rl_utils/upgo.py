"""Upgoing policy update, UPGO (Vinyals et al., 2019, AlphaStar).

The return follows the actual rewards for as long as the next action looked at least as good as the state's value,
and bootstraps from the value otherwise:
``G_t = r_t + gamma_t * (G_{t+1} if Q_{t+1} >= V(x_{t+1}) else V(x_{t+1}))`` with
``Q_{t+1} = r_{t+1} + gamma_{t+1} * V(x_{t+2})`` and ``G_{T-1} = r_{T-1} + gamma_{T-1} * V(x_T)``. The policy is pushed
only towards trajectories that did better than expected.

Conventions are those of ``vtrace.py``: time-major ``(T, B)`` unrolls with ``(T + 1, B)`` values, ``terminated``
cuts bootstrapping (``gamma_t = 0``), a truncation at the unroll's end bootstraps from the caller's last value row,
and the policy enters through log-probabilities of the taken actions. AlphaStar uses ``gamma = 1``.
"""

from __future__ import annotations

import torch

from .a2c import check_same_shape
from .td import generalized_lambda_returns, weighted_mean
from .vtrace import Gammas, check_clip_ratios, check_logp, check_unroll, clipped_ratio, per_step, step_discounts


def upgo_returns(rewards: torch.Tensor, bootstrap_values: torch.Tensor, gammas: Gammas = 0.99) -> torch.Tensor:
    """UPGO returns, a lambda-return whose lambda is 1 where the next step looked good and 0 elsewhere.

    ``lambda_t = [r_{t+1} + gamma_{t+1} * V(x_{t+2}) >= V(x_{t+1})]``, fed to
    :func:`~nervex.rl_utils.td.generalized_lambda_returns`.

    Args:
        rewards: ``r_0 ... r_{T-1}``.
        bootstrap_values: ``V(x_0) ... V(x_T)``; pass them detached to use the result as a target.
        gammas: Discount per step, a float or a tensor like ``rewards``; 0 at a terminated step (see
            :func:`~nervex.rl_utils.vtrace.step_discounts`). DI-engine's ``upgo_returns`` is ``gammas=1``.

    Returns:
        The returns ``G_0 ... G_{T-1}``.

    Shapes:
        - rewards, gammas: :math:`(T, B)`
        - bootstrap_values: :math:`(T + 1, B)`
        - output: :math:`(T, B)`

    Raises:
        ValueError: ``bootstrap_values`` is not ``(T + 1, B)`` or ``gammas`` is not shaped like ``rewards``.
    """
    name = "upgo_returns"
    check_unroll(name, rewards, "bootstrap_values", bootstrap_values)
    gammas = per_step(name, "gammas", gammas, rewards)
    q_values = rewards + gammas * bootstrap_values[1:]
    looked_good = (q_values >= bootstrap_values[:-1]).to(rewards.dtype)
    # lambda_t decides whether G_t follows G_{t+1}, so it is step t+1's comparison; the last one is never used
    lambdas = torch.cat([looked_good[1:], torch.ones_like(looked_good[:1])], dim=0)
    return generalized_lambda_returns(bootstrap_values, rewards, gammas, lambdas)


def upgo_loss(
    target_logp: torch.Tensor,
    behaviour_logp: torch.Tensor,
    reward: torch.Tensor,
    bootstrap_values: torch.Tensor,
    terminated: torch.Tensor | None = None,
    weight: torch.Tensor | None = None,
    gamma: float = 0.99,
    rho_clip_ratio: float = 1.0,
) -> torch.Tensor:
    """UPGO policy-gradient loss ``-mean_w(min(rho_bar, pi / mu) * (G_t - V(x_t)) * target_logp)``.

    The importance weight and the advantage are constants of the gradient (computed without it), so the loss's
    gradient reaches only ``target_logp``; ``mean_w(x) = mean(weight * x)`` over all ``T * B`` entries.

    Args:
        target_logp: ``log pi(a_t | x_t)`` of the taken actions under the trained policy (with gradient).
        behaviour_logp: ``log mu(a_t | x_t)`` under the actor's policy; pass ``target_logp.detach()`` on-policy.
        reward: ``r_0 ... r_{T-1}``.
        bootstrap_values: ``V(x_0) ... V(x_T)`` (detached here).
        terminated: Bool or 0/1 per step, or ``None``: no termination in the unroll.
        weight: 0/1 mask of padded steps (padding must follow a terminated step), or ``None``.
        gamma: Discount factor (AlphaStar: 1).
        rho_clip_ratio: Clip of the importance weights (AlphaStar: 1).

    Returns:
        The loss, a scalar.

    Shapes:
        - target_logp, behaviour_logp, reward, terminated, weight: :math:`(T, B)`
        - bootstrap_values: :math:`(T + 1, B)`
        - output: scalar

    Raises:
        ValueError: a per-step tensor is not shaped like ``reward`` (logits are named as such),
            ``bootstrap_values`` is not ``(T + 1, B)``, or ``rho_clip_ratio`` is not > 0.
    """
    name = "upgo_loss"
    check_clip_ratios(name, rho_clip_ratio=rho_clip_ratio)
    check_unroll(name, reward, "bootstrap_values", bootstrap_values)
    check_logp(name, "target_logp", target_logp, reward)
    check_logp(name, "behaviour_logp", behaviour_logp, reward)
    check_same_shape(name, "reward", tuple(reward.shape), terminated=terminated, weight=weight)
    with torch.no_grad():
        values = bootstrap_values.detach()
        reward = reward.to(values.dtype)
        returns = upgo_returns(reward, values, step_discounts(gamma, terminated, reward))
        rhos = clipped_ratio(target_logp.detach().to(values.dtype) - behaviour_logp.to(values.dtype), rho_clip_ratio)
        adv = rhos * (returns - values[:-1])
    return -weighted_mean(adv.to(target_logp.dtype) * target_logp, weight)
