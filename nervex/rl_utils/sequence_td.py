"""n-step Q-learning over stored sequences (R2D2): per-step termination, padding masks and value rescaling.

The conventions of ``td.py`` hold: time first, ``terminated`` (never ``truncated``) cuts bootstrapping, targets are
detached. What is new is the sequence: every step of it is a learn step with its own n-step window, and a window that
runs past the episode's end (into padding, ``mask`` 0) bootstraps from the first padding step, whose observation is
the episode's final one (how ``Adder(kind='sequence')`` pads).
"""

from __future__ import annotations

from collections import namedtuple
from typing import Tuple

import torch
import torch.nn as nn

from .td import value_inv_transform, value_transform

q_nstep_sequence_td_data = namedtuple(
    "q_nstep_sequence_td_data", ["q", "target_q", "action", "target_action", "reward", "terminated", "mask", "weight"]
)


def _check_shapes(data: q_nstep_sequence_td_data, nstep: int) -> Tuple[int, int]:
    q, target_q, action, target_action, reward, terminated, mask, weight = data
    if q.dim() != 3:
        raise ValueError(f"q_nstep_sequence_td_error: q has shape {tuple(q.shape)}, expected (T, B, A), time first")
    steps, batch = q.shape[:2]
    if steps <= nstep:
        raise ValueError(
            f"q_nstep_sequence_td_error: a sequence of T={steps} steps has no learn step for nstep={nstep}; "
            f"T must exceed nstep (the last nstep steps only bootstrap)"
        )
    if target_q.shape != q.shape:
        raise ValueError(f"q_nstep_sequence_td_error: target_q has shape {tuple(target_q.shape)}, q {tuple(q.shape)}")
    per_step = dict(action=action, target_action=target_action, reward=reward, terminated=terminated, mask=mask)
    for name, tensor in per_step.items():
        if tuple(tensor.shape) != (steps, batch):
            raise ValueError(
                f"q_nstep_sequence_td_error: {name} has shape {tuple(tensor.shape)}, expected (T, B) = "
                f"({steps}, {batch})"
            )
    if weight is not None and tuple(weight.shape) != (batch,):
        raise ValueError(f"q_nstep_sequence_td_error: weight has shape {tuple(weight.shape)}, expected ({batch},)")
    return steps, batch


def q_nstep_sequence_td_error(
    data: q_nstep_sequence_td_data,
    gamma: float,
    nstep: int,
    value_rescale: bool = True,
    eps: float = 1e-3,
    criterion: nn.Module = nn.MSELoss(reduction="none"),
) -> Tuple[torch.Tensor, torch.Tensor]:
    """n-step (double) Q-learning loss over sequences, optionally in R2D2's rescaled value space.

    The learn steps are the first ``U = T - nstep`` steps; the last ``nstep`` only provide rewards and bootstrap
    values. For learn step ``t`` let ``k_t`` be the number of real steps (``mask`` 1) in ``[t, t + nstep)``; then
    ``G_t = sum_{j < k_t} gamma^j alive_j r_{t+j} + gamma^k_t alive_{k_t} v_{t+k_t}`` where ``alive_j`` is 0 once a
    real step before ``t + j`` has ``terminated`` and ``v_s = target_q[s, target_action[s]]``. So a window inside the
    episode is the usual n-step target, one that meets a termination does not bootstrap, and one that meets a
    truncation bootstraps after ``k_t`` steps from the final observation (the first padding step). With
    ``value_rescale`` the networks predict ``h(Q)``: ``G_t = h(... + gamma^k_t alive h^-1(v))`` (Pohlen et al. 2018).

    The loss is the mean over real learn steps of ``criterion(q[t, action[t]], G_t)``, each step weighted by its
    sequence's importance weight. Padding learn steps give no loss and a TD error of 0.

    Args:
        data: ``q_nstep_sequence_td_data(q, target_q, action, target_action, reward, terminated, mask, weight)``.
            ``target_action`` is the action whose target-net value bootstraps at each step (double Q: the online
            net's argmax). ``mask`` must be 1 on a prefix of each sequence (padding only after the episode's end).
        gamma: Discount factor.
        nstep: Reward steps per target.
        value_rescale: Targets in the rescaled space (``q`` and ``target_q`` predict ``h(Q)``).
        eps: The ``eps`` of :func:`~nervex.rl_utils.value_transform`.
        criterion: Element-wise loss with ``reduction='none'``.

    Returns:
        ``(loss, td_error)``: the scalar loss and ``|G_t - q[t, action[t]]|`` per learn step (detached, 0 at
        padding), for :func:`~nervex.data.sequence_priority`.

    Shapes:
        - q, target_q: :math:`(T, B, A)`
        - action, target_action, reward, terminated, mask: :math:`(T, B)`
        - weight: :math:`(B,)` or ``None``
        - output: scalar, :math:`(T - nstep, B)`

    Raises:
        ValueError: a tensor has the wrong shape, or ``T <= nstep``.
    """
    steps, _ = _check_shapes(data, nstep)
    q, target_q, action, target_action, reward, terminated, mask, weight = data
    learn = steps - nstep
    real = mask.to(q.dtype)
    with torch.no_grad():
        value = target_q.gather(2, target_action.long().unsqueeze(-1)).squeeze(-1)
        if value_rescale:
            value = value_inv_transform(value, eps)
        not_terminal = 1.0 - terminated.to(q.dtype) * real
        ret = torch.zeros_like(real[:learn])
        alive = torch.ones_like(ret)
        count = torch.zeros_like(ret)
        for k in range(nstep):
            ret = ret + gamma**k * alive * real[k : k + learn] * reward[k : k + learn].to(q.dtype)
            count = count + real[k : k + learn]
            alive = alive * not_terminal[k : k + learn]
        start = torch.arange(learn, device=q.device).unsqueeze(1)
        bootstrap = value.gather(0, start + count.long())
        target = ret + torch.pow(torch.full_like(count, gamma), count) * alive * bootstrap
        if value_rescale:
            target = value_transform(target, eps)
    q_taken = q[:learn].gather(2, action[:learn].long().unsqueeze(-1)).squeeze(-1)
    step_mask = real[:learn]
    step_loss = criterion(q_taken, target) * step_mask
    if weight is not None:
        step_loss = step_loss * weight.to(q.dtype).unsqueeze(0)
    loss = step_loss.sum() / step_mask.sum().clamp(min=1.0)
    return loss, (target - q_taken).detach().abs() * step_mask
