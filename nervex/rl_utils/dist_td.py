"""Distributional (C51) n-step TD loss with the categorical projection of Bellemare et al. (2017).

Same conventions as ``td.py``: ``done`` is *terminated*, rewards are ``(nstep, B)``, ``value_gamma`` carries the
discount of windows cut short by truncation, and the target distribution is detached.
"""

from __future__ import annotations

from collections import namedtuple
from typing import Tuple

import torch

from .td import check_batch, check_nstep_reward, nstep_return, weighted_mean

dist_nstep_td_data = namedtuple(
    "dist_nstep_td_data", ["dist", "next_n_dist", "act", "next_n_act", "reward", "done", "weight"]
)


def categorical_projection(
    next_dist: torch.Tensor, returns: torch.Tensor, bootstrap_gamma: torch.Tensor, v_min: float, v_max: float
) -> torch.Tensor:
    """Project the distribution of ``returns + bootstrap_gamma * Z`` back onto the fixed support.

    The support is ``z_j = v_min + j * delta``, ``delta = (v_max - v_min) / (n_atom - 1)``. Each shifted atom
    ``Tz_j`` (clipped to ``[v_min, v_max]``) splits its probability between its two neighbouring atoms in
    proportion to closeness; an atom that lands exactly on the support keeps all its mass there.

    Args:
        next_dist: Probabilities over the support of the bootstrap action's return.
        returns: Discounted reward sums of the windows.
        bootstrap_gamma: Discount of the bootstrap, already zero for terminated windows.
        v_min: Lowest atom.
        v_max: Highest atom.

    Returns:
        The projected target distribution.

    Shapes:
        - next_dist: :math:`(B, n\\_atom)`
        - returns, bootstrap_gamma: :math:`(B,)`
        - output: :math:`(B, n\\_atom)`
    """
    batch, n_atom = next_dist.shape
    delta = (v_max - v_min) / (n_atom - 1)
    support = torch.linspace(v_min, v_max, n_atom, dtype=next_dist.dtype, device=next_dist.device)
    target_z = (returns.unsqueeze(1) + bootstrap_gamma.unsqueeze(1) * support.unsqueeze(0)).clamp(v_min, v_max)
    b = (target_z - v_min) / delta
    lower, upper = b.floor().long(), b.ceil().long()
    # When b is an integer, lower == upper and both split weights below are zero: move one neighbour away so
    # the whole mass goes to atom b (weight b - lower = 1 or upper - b = 1).
    lower[(upper > 0) & (lower == upper)] -= 1
    upper[(lower < n_atom - 1) & (lower == upper)] += 1
    offset = (torch.arange(batch, device=next_dist.device) * n_atom).unsqueeze(1)
    projected = torch.zeros(batch * n_atom, dtype=next_dist.dtype, device=next_dist.device)
    projected.index_add_(0, (lower + offset).reshape(-1), (next_dist * (upper.to(b.dtype) - b)).reshape(-1))
    projected.index_add_(0, (upper + offset).reshape(-1), (next_dist * (b - lower.to(b.dtype))).reshape(-1))
    return projected.reshape(batch, n_atom)


def dist_nstep_td_error(
    data: dist_nstep_td_data,
    gamma: float,
    v_min: float,
    v_max: float,
    n_atom: int,
    nstep: int = 1,
    value_gamma: torch.Tensor | None = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """C51 n-step loss: cross-entropy between the projected target distribution and ``dist[act]``.

    The target is the distribution of ``sum_k gamma^k r_k + bootstrap_gamma * (1 - done) * Z(s', a')`` projected
    onto the support, with ``Z(s', a') = next_n_dist[next_n_act]`` and ``bootstrap_gamma = value_gamma`` or
    ``gamma ** nstep``.

    Args:
        data: ``dist_nstep_td_data(dist, next_n_dist, act, next_n_act, reward, done, weight)``; ``dist`` and
            ``next_n_dist`` are probabilities (softmax over atoms), ``done`` is *terminated*.
        gamma: Discount factor.
        v_min: Lowest atom of the support.
        v_max: Highest atom of the support.
        n_atom: Number of atoms; must match the last dim of ``dist``.
        nstep: Number of reward steps in the window.
        value_gamma: Per-sample bootstrap discount; ``None`` uses ``gamma ** nstep``.

    Returns:
        ``(loss, cross_entropy_per_sample)``: the importance-weighted mean loss, and the detached per-sample
        cross-entropy, which Rainbow uses as the replay priority.

    Shapes:
        - dist, next_n_dist: :math:`(B, N, n\\_atom)`
        - act, next_n_act, done: :math:`(B,)`
        - reward: :math:`(nstep, B)`
        - weight, value_gamma: :math:`(B,)` or ``None``
        - output: scalar, :math:`(B,)`

    Raises:
        ValueError: a shape does not match (atoms, reward layout, batch size) or ``v_min >= v_max``.
    """
    dist, next_n_dist, act, next_n_act, reward, done, weight = data
    name = "dist_nstep_td_error"
    if dist.dim() != 3 or dist.shape[-1] != n_atom or next_n_dist.shape != dist.shape:
        raise ValueError(
            f"{name}: dist has shape {tuple(dist.shape)} and next_n_dist {tuple(next_n_dist.shape)}; expected both "
            f"(B, N, n_atom) with n_atom={n_atom}"
        )
    if not v_min < v_max:
        raise ValueError(f"{name}: v_min={v_min} must be below v_max={v_max}")
    batch = dist.shape[0]
    check_batch(name, batch, act=act, next_n_act=next_n_act, done=done, weight=weight, value_gamma=value_gamma)
    check_nstep_reward(name, reward, nstep, batch)
    batch_index = torch.arange(batch, device=dist.device)
    dist_s_a = dist[batch_index, act.long()]
    with torch.no_grad():
        next_dist = next_n_dist[batch_index, next_n_act.long()]
        bootstrap_gamma = torch.full((batch,), gamma**nstep, dtype=dist.dtype, device=dist.device)
        if value_gamma is not None:
            bootstrap_gamma = value_gamma.to(dist.dtype)
        bootstrap_gamma = bootstrap_gamma * (1.0 - done.to(dist.dtype))
        target = categorical_projection(
            next_dist, nstep_return(reward, gamma, nstep, name), bootstrap_gamma, v_min, v_max
        )
    # clamp keeps log finite where the online net puts (numerically) zero mass on an atom.
    cross_entropy = -(target * dist_s_a.clamp(min=1e-6).log()).sum(-1)
    return weighted_mean(cross_entropy, weight), cross_entropy.detach()
