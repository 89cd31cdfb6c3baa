"""COMA (Foerster et al. 2018): the counterfactual advantage, the acting distribution and the critic's TD(lambda)
targets, as pure tensor functions.

COMA's critic outputs, for agent ``a`` with the other agents' actions ``u_-a`` fixed, ``Q(s, (u_-a, u'))`` for every
action ``u'`` of ``a`` in one pass. The advantage of ``a``'s taken action ``u_a`` is its value minus the value of
``a``'s own policy averaged over its actions with everyone else's held fixed (the counterfactual baseline)::

    A_a(s, u) = Q(s, u)[u_a] - sum_u' pi_a(u' | tau_a) Q(s, (u_-a, u'))

The critic learns TD(lambda) returns of the taken joint actions, computed from a target critic (``coma_lambda_return``).
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch


def masked_mean(x: torch.Tensor, mask: Optional[torch.Tensor]) -> torch.Tensor:
    """``sum(mask * x) / sum(mask)`` (0 when the mask is all zero); a plain mean without a mask.

    Shapes:
        - x: :math:`(*)`; mask: broadcastable to ``x``
        - output: scalar
    """
    if mask is None:
        return x.mean()
    mask = mask.to(x.dtype).expand_as(x)
    return (x * mask).sum() / mask.sum().clamp(min=1.0)


def coma_policy_probs(
    logit: torch.Tensor, action_mask: Optional[torch.Tensor] = None, eps: float = 0.0
) -> torch.Tensor:
    """The acting distribution of COMA's actors: a softmax over the legal actions with an epsilon floor over them.

    ``pi = (1 - eps) * softmax(logit over legal actions) + eps / n_legal`` on legal actions and exactly 0 on illegal
    ones (PyMARL's ``pi_logits`` output with ``mask_before_softmax``). A row with no legal action (a padding step, the
    final observation of an agent that finished) is treated as all-legal so that ``pi`` stays finite; such rows must
    be masked out of any loss.

    Args:
        logit: The actor's logits.
        action_mask: 1/True = legal, same shape as ``logit``; None: every action is legal.
        eps: The exploration floor, in [0, 1].

    Returns:
        Probabilities summing to 1 over the last axis.

    Shapes:
        - logit, action_mask: :math:`(*, A)`
        - output: :math:`(*, A)`

    Raises:
        ValueError: ``eps`` outside [0, 1] or a mask of another shape than ``logit``.
    """
    if not 0.0 <= float(eps) <= 1.0:
        raise ValueError(f"coma_policy_probs: eps must be in [0, 1], got {eps}")
    if action_mask is None:
        legal = torch.ones_like(logit, dtype=torch.bool)
    else:
        if tuple(action_mask.shape) != tuple(logit.shape):
            raise ValueError(
                f"coma_policy_probs: action_mask shape {tuple(action_mask.shape)} differs from logit "
                f"{tuple(logit.shape)}; one entry per action of each agent is needed"
            )
        legal = action_mask.to(logit.device).bool()
        legal = legal | ~legal.any(dim=-1, keepdim=True)
    probs = torch.softmax(logit.masked_fill(~legal, float("-inf")), dim=-1)
    floor = legal.to(probs.dtype) / legal.sum(dim=-1, keepdim=True).to(probs.dtype)
    return (1.0 - eps) * probs + eps * floor


class ComaAdvantage(NamedTuple):
    """What ``coma_advantage`` returns, each :math:`(*)` (zero where masked)."""

    advantage: torch.Tensor  # q_taken - baseline
    q_taken: torch.Tensor  # Q(s, u)[u_a]
    baseline: torch.Tensor  # sum_u' pi_a(u') Q(s, (u_-a, u'))


def coma_advantage(
    q: torch.Tensor, pi: torch.Tensor, action: torch.Tensor, mask: Optional[torch.Tensor] = None
) -> ComaAdvantage:
    """The counterfactual advantage of each agent's taken action.

    Args:
        q: The critic's ``Q(s, (u_-a, u'))`` for every action ``u'`` of agent ``a`` (the others' taken actions fixed).
        pi: Agent ``a``'s action probabilities (0 on illegal actions, so illegal actions add nothing to the baseline).
        action: The actions taken.
        mask: 1 where the value counts (a real step of an alive agent), 0 for padding and dead agents; None: all.

    Returns:
        ``ComaAdvantage(advantage, q_taken, baseline)``, each multiplied by ``mask``.

    Shapes:
        - q, pi: :math:`(*, A)`; action: :math:`(*)` int64; mask: :math:`(*)`
        - each output: :math:`(*)`
    """
    q_taken = q.gather(-1, action.long().unsqueeze(-1)).squeeze(-1)
    baseline = (pi * q).sum(dim=-1)
    advantage = q_taken - baseline
    if mask is not None:
        mask = mask.to(q.dtype)
        advantage, q_taken, baseline = advantage * mask, q_taken * mask, baseline * mask
    return ComaAdvantage(advantage, q_taken, baseline)


def coma_lambda_return(
    reward: torch.Tensor,
    target_value: torch.Tensor,
    terminated: torch.Tensor,
    truncated: torch.Tensor,
    mask: torch.Tensor,
    gamma: float,
    lambda_: float,
) -> torch.Tensor:
    """TD(lambda) returns for COMA's critic over a batch of padded episodes, time-major.

    Backwards over each episode, with ``done_t = terminated_t or truncated_t``::

        G_t = r_t + gamma * (1 - terminated_t) * ((1 - l_t) * V_{t+1} + l_t * G_{t+1}),   l_t = lambda * (1 - done_t)

    ``V_{t+1}`` is ``target_value[t + 1]``: the target critic's value of the next step's taken joint action, and after
    an episode's last step its value at the final observation. So a termination bootstraps nothing, a time-limit
    truncation bootstraps fully from ``target_value`` at the final observation, and the recursion never crosses an
    episode's end into the padding after it; padding steps (``mask`` 0) get a return of 0.

    Args:
        reward: The team reward of each step.
        target_value: ``V_t`` for ``t = 0 .. T``: row ``T`` exists so that an episode using every step can bootstrap.
        terminated, truncated: Flags of each step (0/1 or bool).
        mask: 1 for a real step, 0 for padding.
        gamma: Discount factor.
        lambda_: TD(lambda)'s lambda (0: one-step targets, 1: Monte Carlo up to the episode's end).

    Returns:
        ``G_t`` for every step and agent (0 where ``mask`` is 0).

    Shapes:
        - reward, terminated, truncated, mask: :math:`(T, B)`
        - target_value: :math:`(T + 1, B, *)` (``*``: e.g. the agents ``N``)
        - output: :math:`(T, B, *)`

    Raises:
        ValueError: ``target_value`` does not have one more row than ``reward``.
    """
    steps = reward.shape[0]
    if target_value.shape[0] != steps + 1 or tuple(target_value.shape[1:2]) != tuple(reward.shape[1:2]):
        raise ValueError(
            f"coma_lambda_return: target_value has shape {tuple(target_value.shape)}; with reward "
            f"{tuple(reward.shape)} (T, B) it must be (T + 1, B, ...): one value more, for the final observation"
        )
    extra = (1,) * (target_value.dim() - 2)

    def per_step(x: torch.Tensor) -> torch.Tensor:
        return x.to(target_value.dtype).reshape(*x.shape, *extra)

    reward, mask = per_step(reward), per_step(mask)
    terminated, truncated = per_step(terminated), per_step(truncated)
    done = torch.maximum(terminated, truncated)
    returns = torch.zeros_like(target_value[:steps])
    after = torch.zeros_like(target_value[0])
    for t in reversed(range(steps)):
        lam = lambda_ * (1.0 - done[t])
        mixed = (1.0 - lam) * target_value[t + 1] + lam * after
        after = mask[t] * (reward[t] + gamma * (1.0 - terminated[t]) * mixed)
        returns[t] = after
    return returns


__all__ = ["ComaAdvantage", "coma_advantage", "coma_lambda_return", "coma_policy_probs", "masked_mean"]
