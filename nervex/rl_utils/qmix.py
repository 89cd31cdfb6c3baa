"""QMIX / VDN targets over padded episode sequences: per-agent values, double-Q bootstrap values, n-step and TD(lambda)
team targets.

The layout is ``Adder(kind='sequence')``'s (see ``sequence_td``): time first; ``mask`` is 1 on a prefix of each
sequence (real steps) and 0 on the padding after an episode's end, whose first step holds the episode's final
observation; ``terminated`` (never ``truncated``) cuts bootstrapping, so a time limit bootstraps from that final
observation. Agents that have left the episode (``alive`` 0) contribute nothing: their Q-values enter the mixer as 0,
so whatever action they were given (a no-op) has no effect on the team's value.
"""

from __future__ import annotations

from collections import namedtuple
from typing import Optional, Tuple

import torch
import torch.nn as nn

from .td import masked_argmax

qmix_td_data = namedtuple("qmix_td_data", ["q_tot", "target_q_tot", "reward", "terminated", "mask", "weight"])


def chosen_agent_q(q: torch.Tensor, action: torch.Tensor, alive: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Each agent's Q-value of its action, 0 for a dead agent (the mixer's input).

    Args:
        q: Per-agent action values.
        action: Each agent's action index.
        alive: 1 while the agent is in the episode, 0 after it left; ``None``: every agent is alive.

    Returns:
        ``q[..., a, action[..., a]] * alive[..., a]``.

    Shapes:
        - q: :math:`(*L, N, A)`
        - action, alive: :math:`(*L, N)`
        - output: :math:`(*L, N)`

    Raises:
        ValueError: ``action`` or ``alive`` does not match the leading axes of ``q``.
    """
    if tuple(action.shape) != tuple(q.shape[:-1]):
        raise ValueError(f"chosen_agent_q: action has shape {tuple(action.shape)}, expected {tuple(q.shape[:-1])}")
    taken = q.gather(-1, action.long().unsqueeze(-1)).squeeze(-1)
    if alive is None:
        return taken
    if tuple(alive.shape) != tuple(taken.shape):
        raise ValueError(f"chosen_agent_q: alive has shape {tuple(alive.shape)}, expected {tuple(taken.shape)}")
    return taken * alive.to(taken.dtype)


def bootstrap_agent_q(
    target_q: torch.Tensor,
    online_q: Optional[torch.Tensor],
    action_mask: Optional[torch.Tensor] = None,
    alive: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Each agent's bootstrap value and action at every step: the target net's value of the legal action that the
    online net ranks highest (double Q), or of the target net's own best legal action when ``online_q`` is None.

    The target mixer then mixes these values into the bootstrap ``Q_tot``. Dead agents get 0.

    Args:
        target_q: The target network's per-agent values.
        online_q: The online network's per-agent values (detached), or None for the plain max.
        action_mask: 1 = legal at that step; ``None``: every action is legal.
        alive: As in :func:`chosen_agent_q`.

    Returns:
        ``(value, action)``: the values :math:`(*L, N)` and the chosen actions :math:`(*L, N)` int64.

    Shapes:
        - target_q, online_q, action_mask: :math:`(*L, N, A)`
        - alive: :math:`(*L, N)`
    """
    if online_q is not None and online_q.shape != target_q.shape:
        raise ValueError(
            f"bootstrap_agent_q: online_q has shape {tuple(online_q.shape)}, target_q {tuple(target_q.shape)}"
        )
    action = masked_argmax(target_q if online_q is None else online_q, action_mask)
    return chosen_agent_q(target_q, action, alive), action


def _check_td_shapes(data: qmix_td_data, nstep: int) -> Tuple[int, int]:
    q_tot, target_q_tot, reward, terminated, mask, weight = data
    if q_tot.dim() != 2:
        raise ValueError(f"qmix_td_error: q_tot has shape {tuple(q_tot.shape)}, expected (T, B), time first")
    steps, batch = q_tot.shape
    if steps <= nstep:
        raise ValueError(
            f"qmix_td_error: a sequence of T={steps} steps has no learn step for nstep={nstep}; T must exceed nstep "
            "(the last nstep steps only bootstrap)"
        )
    for name, tensor in dict(target_q_tot=target_q_tot, reward=reward, terminated=terminated, mask=mask).items():
        if tuple(tensor.shape) != (steps, batch):
            raise ValueError(
                f"qmix_td_error: {name} has shape {tuple(tensor.shape)}, expected (T, B) = ({steps}, {batch})"
            )
    if weight is not None and tuple(weight.shape) != (batch,):
        raise ValueError(f"qmix_td_error: weight has shape {tuple(weight.shape)}, expected ({batch},)")
    return steps, batch


def qmix_td_target(
    target_q_tot: torch.Tensor,
    reward: torch.Tensor,
    terminated: torch.Tensor,
    mask: torch.Tensor,
    gamma: float,
    nstep: int = 1,
    td_lambda: float = 1.0,
) -> torch.Tensor:
    """Team targets of the first ``U = T - nstep`` steps: the k-step returns mixed by TD(lambda) over ``nstep``.

    For learn step ``t`` and ``k = 1..nstep`` let ``c_k`` be the number of real steps in ``[t, t + k)``; the k-step
    return is ``G_t^(k) = sum_{j < c_k} gamma^j alive_j r_{t+j} + gamma^c_k alive_{c_k} v_{t + c_k}``, where
    ``alive_j`` is 0 once a real step before ``t + j`` has ``terminated`` and ``v`` is ``target_q_tot``. So a window
    inside the episode is the usual k-step return, one that meets a termination does not bootstrap, and one that
    meets a truncation bootstraps from the final observation (the first padding step). The target is the lambda-return
    truncated at ``nstep`` steps, ``(1 - lambda) sum_{k < n} lambda^(k-1) G^(k) + lambda^(n-1) G^(n)``: ``td_lambda``
    1 gives the n-step return, 0 (or ``nstep`` 1) the 1-step return.

    Args:
        target_q_tot: The target mixer's value of the bootstrap joint action at each step.
        reward: The team reward of each step.
        terminated: The step ended the episode in a terminal state.
        mask: 1 for real steps, 0 for padding (a prefix of ones).
        gamma: Discount factor.
        nstep: The longest return in the mix.
        td_lambda: Lambda of the mix, in ``[0, 1]``.

    Returns:
        The targets (detached).

    Shapes:
        - target_q_tot, reward, terminated, mask: :math:`(T, B)`
        - output: :math:`(T - nstep, B)`
    """
    if not 0.0 <= td_lambda <= 1.0:
        raise ValueError(f"qmix_td_target: td_lambda must be in [0, 1], got {td_lambda}")
    learn = target_q_tot.shape[0] - nstep
    with torch.no_grad():
        value = target_q_tot.detach()
        real = mask.to(value.dtype)
        not_terminal = 1.0 - terminated.to(value.dtype) * real
        ret = torch.zeros_like(real[:learn])
        alive = torch.ones_like(ret)
        count = torch.zeros_like(ret)
        start = torch.arange(learn, device=value.device).unsqueeze(1)
        target = torch.zeros_like(ret)
        for k in range(1, nstep + 1):
            j = k - 1
            ret = ret + gamma**j * alive * real[j : j + learn] * reward[j : j + learn].to(value.dtype)
            count = count + real[j : j + learn]
            alive = alive * not_terminal[j : j + learn]
            g_k = ret + torch.pow(torch.full_like(count, gamma), count) * alive * value.gather(0, start + count.long())
            share = td_lambda ** (k - 1) * ((1.0 - td_lambda) if k < nstep else 1.0)
            target = target + share * g_k
    return target


def qmix_td_error(
    data: qmix_td_data,
    gamma: float,
    nstep: int = 1,
    td_lambda: float = 1.0,
    criterion: nn.Module = nn.MSELoss(reduction="none"),
) -> Tuple[torch.Tensor, torch.Tensor]:
    """The QMIX / VDN loss over sequences: ``criterion(Q_tot(s_t, u_t), target_t)`` on real learn steps.

    Args:
        data: ``qmix_td_data(q_tot, target_q_tot, reward, terminated, mask, weight)``: the online mixer's value of
            the joint action taken, the target mixer's value of the bootstrap joint action (see
            :func:`bootstrap_agent_q`), the team reward, the flags, and per-sequence importance weights (or None).
        gamma, nstep, td_lambda: See :func:`qmix_td_target`.
        criterion: Element-wise loss with ``reduction='none'``.

    Returns:
        ``(loss, td_error)``: the mean over real learn steps of the weighted criterion, and ``|target - q_tot|`` per
        learn step (detached, 0 at padding).

    Shapes:
        - q_tot, target_q_tot, reward, terminated, mask: :math:`(T, B)`
        - weight: :math:`(B,)` or ``None``
        - output: scalar, :math:`(T - nstep, B)`

    Raises:
        ValueError: a tensor of the wrong shape, ``T <= nstep``, or ``td_lambda`` outside ``[0, 1]``.
    """
    _check_td_shapes(data, nstep)
    q_tot, target_q_tot, reward, terminated, mask, weight = data
    target = qmix_td_target(target_q_tot, reward, terminated, mask, gamma, nstep, td_lambda)
    learn = target.shape[0]
    step_mask = mask[:learn].to(q_tot.dtype)
    step_loss = criterion(q_tot[:learn], target) * step_mask
    if weight is not None:
        step_loss = step_loss * weight.to(q_tot.dtype).unsqueeze(0)
    loss = step_loss.sum() / step_mask.sum().clamp(min=1.0)
    return loss, (target - q_tot[:learn]).detach().abs() * step_mask
