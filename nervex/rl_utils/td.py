"""Temporal-difference targets and losses for Q-values and state values.

Conventions shared by every function here:

- ``done`` is *terminated*: the only thing that cuts bootstrapping. A window cut short by a time-limit truncation
  still bootstraps; its discount is passed as ``value_gamma`` (``gamma ** k`` for a window of ``k`` steps, which
  ``Adder.get_nstep_return_data(..., gamma=...)`` computes).
- n-step rewards are laid out ``(nstep, B)``: time first, like every other sequence in nervex.
- Targets are built from detached tensors, so gradients flow only into the online estimate (``q`` / ``v``).
- ``weight`` is the per-sample importance-sampling weight from prioritized replay; ``None`` means ones.

The distributional (C51) loss lives in ``dist_td.py`` to keep this file short.
"""

from __future__ import annotations

from collections import namedtuple
from typing import Optional, Tuple, Union

import torch
import torch.nn as nn

q_1step_td_data = namedtuple("q_1step_td_data", ["q", "next_q", "act", "next_act", "reward", "done", "weight"])
q_nstep_td_data = namedtuple(
    "q_nstep_td_data", ["q", "next_n_q", "action", "next_n_action", "reward", "done", "weight"]
)
v_1step_td_data = namedtuple("v_1step_td_data", ["v", "next_v", "reward", "done", "weight"])
v_nstep_td_data = namedtuple("v_nstep_td_data", ["v", "next_n_v", "reward", "done", "weight"])
td_lambda_data = namedtuple("td_lambda_data", ["value", "reward", "done", "weight"])


def weighted_mean(loss: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
    """Mean of ``weight * loss``; ``weight=None`` means an unweighted mean.

    Shapes:
        - loss: :math:`(B, *)`
        - weight: :math:`(B,)` or ``None``; broadcast over trailing dims of ``loss``
        - output: scalar
    """
    if weight is None:
        return loss.mean()
    weight = weight.to(loss.dtype).reshape(weight.shape + (1,) * (loss.dim() - weight.dim()))
    return (weight * loss).mean()


def nstep_return(reward: torch.Tensor, gamma: float, nstep: int, fn_name: str = "nstep_return") -> torch.Tensor:
    """Discounted sum of an n-step reward window, ``sum_k gamma^k r_k``.

    Args:
        reward: Rewards of the window, time first; steps after an episode's end are zero.
        gamma: Discount factor.
        nstep: Window length the caller expects; checked against ``reward.shape[0]``.
        fn_name: Name of the calling function, for the error message.

    Returns:
        The discounted reward sum per sample.

    Shapes:
        - reward: :math:`(nstep, B, *)`
        - output: :math:`(B, *)`

    Raises:
        ValueError: ``reward`` is not laid out ``(nstep, ...)``.
    """
    if reward.dim() < 1 or reward.shape[0] != nstep:
        raise ValueError(
            f"{fn_name}: reward has shape {tuple(reward.shape)} but nstep={nstep}; expected (nstep, B) = "
            f"({nstep}, B) with time first (transpose a (B, nstep) reward)"
        )
    if nstep == 1:
        return reward[0]
    factors = gamma ** torch.arange(nstep, dtype=reward.dtype, device=reward.device)
    return (factors.reshape((nstep,) + (1,) * (reward.dim() - 1)) * reward).sum(0)


def masked_argmax(q: torch.Tensor, action_mask: Optional[torch.Tensor]) -> torch.Tensor:
    """The legal action with the largest value in each row (the n-step target's max / double DQN's argmax).

    A row with no legal action is the observation of a finished game, whose bootstrap ``done`` cuts: it takes the
    unmasked argmax, so the value gathered from it stays finite (``-inf * 0`` would be NaN).

    Args:
        q: Action values.
        action_mask: 1/True = legal, same shape as ``q``; ``None``: every action is legal.

    Returns:
        The chosen action indices (int64).

    Raises:
        ValueError: ``action_mask`` and ``q`` differ in shape.

    Shapes:
        ``q`` ``(B, A)``, ``action_mask`` ``(B, A)`` -> ``(B,)``.
    """
    if action_mask is None:
        return q.argmax(dim=-1)
    legal = torch.as_tensor(action_mask, device=q.device).bool()
    if legal.shape != q.shape:
        raise ValueError(f"masked_argmax: action_mask shape {tuple(legal.shape)} differs from q {tuple(q.shape)}")
    legal = legal | ~legal.any(dim=-1, keepdim=True)  # no legal action: every action, the value is cut anyway
    return q.masked_fill(~legal, float("-inf")).argmax(dim=-1)


def check_nstep_reward(fn_name: str, reward: torch.Tensor, nstep: int, batch: int) -> None:
    """Raise ``ValueError`` unless ``reward`` is laid out ``(nstep, B)``.

    Shapes:
        - reward: :math:`(nstep, B)`
    """
    if tuple(reward.shape) != (nstep, batch):
        hint = " (it looks like (B, nstep): transpose it)" if tuple(reward.shape) == (batch, nstep) else ""
        raise ValueError(
            f"{fn_name}: reward has shape {tuple(reward.shape)} but nstep={nstep} and batch size {batch} need "
            f"(nstep, B) = ({nstep}, {batch}){hint}"
        )


def check_batch(fn_name: str, batch: int, **tensors: torch.Tensor | None) -> None:
    """Raise ``ValueError`` if any given tensor's leading dimension is not ``batch``."""
    for name, tensor in tensors.items():
        if tensor is not None and (tensor.dim() == 0 or tensor.shape[0] != batch):
            raise ValueError(
                f"{fn_name}: {name} has shape {tuple(tensor.shape)} but the batch size is {batch}; expected ({batch},)"
            )


def q_1step_td_error(
    data: q_1step_td_data, gamma: float, criterion: nn.Module = nn.MSELoss(reduction="none")
) -> torch.Tensor:
    """One-step Q-learning loss: ``criterion(q[act], r + gamma * (1 - done) * next_q[next_act])``.

    Args:
        data: ``q_1step_td_data(q, next_q, act, next_act, reward, done, weight)``. ``next_act`` is chosen by the
            caller (argmax of the target net for DQN, of the online net for double DQN); ``done`` is *terminated*.
        gamma: Discount factor.
        criterion: Element-wise loss with ``reduction='none'``.

    Returns:
        The importance-weighted mean loss (a scalar).

    Shapes:
        - q, next_q: :math:`(B, N)` with ``N`` the number of actions
        - act, next_act: :math:`(B,)`, int64
        - reward, done: :math:`(B,)`
        - weight: :math:`(B,)` or ``None``
        - output: scalar
    """
    q, next_q, act, next_act, reward, done, weight = data
    batch = q.shape[0]
    check_batch("q_1step_td_error", batch, act=act, next_act=next_act, reward=reward, done=done, weight=weight)
    q_s_a = q.gather(1, act.long().unsqueeze(1)).squeeze(1)
    with torch.no_grad():
        next_q_s_a = next_q.gather(1, next_act.long().unsqueeze(1)).squeeze(1)
        target = reward + gamma * (1.0 - done.to(q.dtype)) * next_q_s_a
    return weighted_mean(criterion(q_s_a, target), weight)


def q_nstep_td_error(
    data: q_nstep_td_data,
    gamma: float,
    nstep: int = 1,
    value_gamma: torch.Tensor | None = None,
    criterion: nn.Module = nn.MSELoss(reduction="none"),
    return_td_error: bool = False,
) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """n-step Q-learning loss, and on request the per-sample TD error used as the new replay priority.

    ``target = sum_k gamma^k r_k + bootstrap_gamma * (1 - done) * next_n_q[next_n_action]`` with
    ``bootstrap_gamma = value_gamma`` if given (windows cut short by truncation) else ``gamma ** nstep``.

    Args:
        data: ``q_nstep_td_data(q, next_n_q, action, next_n_action, reward, done, weight)``; ``done`` is
            *terminated* at the window's last step.
        gamma: Discount factor.
        nstep: Number of reward steps in the window.
        value_gamma: Per-sample bootstrap discount; ``None`` uses ``gamma ** nstep`` for every sample.
        criterion: Element-wise loss with ``reduction='none'``.
        return_td_error: Also return ``|target - q[action]|`` per sample (detached), for prioritized replay.

    Returns:
        The importance-weighted mean loss; with ``return_td_error``, ``(loss, td_error_per_sample)``.

    Shapes:
        - q, next_n_q: :math:`(B, N)`
        - action, next_n_action: :math:`(B,)`, int64
        - reward: :math:`(nstep, B)`
        - done, weight, value_gamma: :math:`(B,)` (``weight``/``value_gamma`` may be ``None``)
        - output: scalar, :math:`(B,)`

    Raises:
        ValueError: ``reward`` is not ``(nstep, B)`` or a per-sample tensor is not ``(B,)``.
    """
    q, next_n_q, action, next_n_action, reward, done, weight = data
    batch = q.shape[0]
    name = "q_nstep_td_error"
    check_batch(name, batch, action=action, next_n_action=next_n_action, done=done, weight=weight)
    check_batch(name, batch, value_gamma=value_gamma)
    check_nstep_reward(name, reward, nstep, batch)
    q_s_a = q.gather(1, action.long().unsqueeze(1)).squeeze(1)
    with torch.no_grad():
        target_q_s_a = next_n_q.gather(1, next_n_action.long().unsqueeze(1)).squeeze(1)
        bootstrap_gamma = gamma**nstep if value_gamma is None else value_gamma.to(q.dtype)
        target = nstep_return(reward, gamma, nstep, name) + bootstrap_gamma * (1.0 - done.to(q.dtype)) * target_q_s_a
    loss = weighted_mean(criterion(q_s_a, target), weight)
    return (loss, (target - q_s_a).abs().detach()) if return_td_error else loss


def v_1step_td_error(
    data: v_1step_td_data, gamma: float, criterion: nn.Module = nn.MSELoss(reduction="none")
) -> torch.Tensor:
    """One-step state-value loss: ``criterion(v, r + gamma * (1 - done) * next_v)``.

    Args:
        data: ``v_1step_td_data(v, next_v, reward, done, weight)``; ``done`` is *terminated*.
        gamma: Discount factor.
        criterion: Element-wise loss with ``reduction='none'``.

    Returns:
        The importance-weighted mean loss (a scalar).

    Shapes:
        - v, next_v, reward, done: :math:`(B,)`
        - weight: :math:`(B,)` or ``None``
        - output: scalar
    """
    v, next_v, reward, done, weight = data
    check_batch("v_1step_td_error", v.shape[0], next_v=next_v, reward=reward, done=done, weight=weight)
    with torch.no_grad():
        target = reward + gamma * (1.0 - done.to(v.dtype)) * next_v
    return weighted_mean(criterion(v, target), weight)


def v_nstep_td_error(
    data: v_nstep_td_data,
    gamma: float,
    nstep: int = 1,
    value_gamma: torch.Tensor | None = None,
    criterion: nn.Module = nn.MSELoss(reduction="none"),
) -> Tuple[torch.Tensor, torch.Tensor]:
    """n-step state-value loss and per-sample TD error, the state-value twin of :func:`q_nstep_td_error`.

    ``target = sum_k gamma^k r_k + bootstrap_gamma * (1 - done) * next_n_v``.

    Args:
        data: ``v_nstep_td_data(v, next_n_v, reward, done, weight)``; ``done`` is *terminated*.
        gamma: Discount factor.
        nstep: Number of reward steps in the window.
        value_gamma: Per-sample bootstrap discount; ``None`` uses ``gamma ** nstep``.
        criterion: Element-wise loss with ``reduction='none'``.

    Returns:
        ``(loss, td_error_per_sample)`` with ``td_error_per_sample = |target - v|`` detached.

    Shapes:
        - v, next_n_v, done: :math:`(B,)`
        - reward: :math:`(nstep, B)`
        - weight, value_gamma: :math:`(B,)` or ``None``
        - output: scalar, :math:`(B,)`

    Raises:
        ValueError: ``reward`` is not ``(nstep, B)`` or a per-sample tensor is not ``(B,)``.
    """
    v, next_n_v, reward, done, weight = data
    batch = v.shape[0]
    name = "v_nstep_td_error"
    check_batch(name, batch, next_n_v=next_n_v, done=done, weight=weight, value_gamma=value_gamma)
    check_nstep_reward(name, reward, nstep, batch)
    with torch.no_grad():
        bootstrap_gamma = gamma**nstep if value_gamma is None else value_gamma.to(v.dtype)
        target = nstep_return(reward, gamma, nstep, name) + bootstrap_gamma * (1.0 - done.to(v.dtype)) * next_n_v
    loss = weighted_mean(criterion(v, target), weight)
    return loss, (target - v).abs().detach()


def value_transform(x: torch.Tensor, eps: float = 1e-3) -> torch.Tensor:
    """R2D2's value rescaling ``h(x) = sign(x) * (sqrt(|x| + 1) - 1) + eps * x``.

    It squashes large returns so one network can fit games with very different reward scales; the ``eps * x``
    term keeps ``h`` invertible with a Lipschitz-continuous inverse (Pohlen et al., 2018).

    Shapes:
        - x: any
        - output: same as ``x``
    """
    return torch.sign(x) * (torch.sqrt(torch.abs(x) + 1) - 1) + eps * x


def value_inv_transform(x: torch.Tensor, eps: float = 1e-3) -> torch.Tensor:
    """Inverse of :func:`value_transform`: ``h^-1(x) = sign(x) * (((sqrt(1 + 4 eps (|x| + 1 + eps)) - 1) / 2 eps)^2 - 1)``.

    Shapes:
        - x: any
        - output: same as ``x``
    """
    root = (torch.sqrt(1 + 4 * eps * (torch.abs(x) + 1 + eps)) - 1) / (2 * eps)
    return torch.sign(x) * (root.square() - 1)


def q_nstep_td_error_with_rescale(
    data: q_nstep_td_data,
    gamma: float,
    nstep: int = 1,
    value_gamma: torch.Tensor | None = None,
    criterion: nn.Module = nn.MSELoss(reduction="none"),
    eps: float = 1e-3,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """:func:`q_nstep_td_error` for a network that predicts rescaled values ``h(Q)`` (R2D2).

    ``target = h(sum_k gamma^k r_k + bootstrap_gamma * (1 - done) * h^-1(next_n_q[next_n_action]))``: the
    bootstrap value is brought back to the reward scale before the Bellman backup, then rescaled again.

    Args:
        data: As for :func:`q_nstep_td_error`; ``q`` and ``next_n_q`` are in the rescaled space.
        gamma: Discount factor.
        nstep: Number of reward steps in the window.
        value_gamma: Per-sample bootstrap discount; ``None`` uses ``gamma ** nstep``.
        criterion: Element-wise loss with ``reduction='none'``.
        eps: The ``eps`` of :func:`value_transform`.

    Returns:
        ``(loss, td_error_per_sample)``, both measured in the rescaled space.

    Shapes:
        - same as :func:`q_nstep_td_error`
    """
    q, next_n_q, action, next_n_action, reward, done, weight = data
    batch = q.shape[0]
    name = "q_nstep_td_error_with_rescale"
    check_batch(name, batch, action=action, next_n_action=next_n_action, done=done, weight=weight)
    check_batch(name, batch, value_gamma=value_gamma)
    check_nstep_reward(name, reward, nstep, batch)
    q_s_a = q.gather(1, action.long().unsqueeze(1)).squeeze(1)
    with torch.no_grad():
        target_q_s_a = value_inv_transform(next_n_q.gather(1, next_n_action.long().unsqueeze(1)).squeeze(1), eps)
        bootstrap_gamma = gamma**nstep if value_gamma is None else value_gamma.to(q.dtype)
        target = nstep_return(reward, gamma, nstep, name) + bootstrap_gamma * (1.0 - done.to(q.dtype)) * target_q_s_a
        target = value_transform(target, eps)
    loss = weighted_mean(criterion(q_s_a, target), weight)
    return loss, (target - q_s_a).abs().detach()


def generalized_lambda_returns(
    bootstrap_values: torch.Tensor,
    rewards: torch.Tensor,
    gammas: Union[float, torch.Tensor],
    lambda_: Union[float, torch.Tensor],
) -> torch.Tensor:
    """lambda-returns over a sequence, computed backwards.

    ``G_{T-1} = r_{T-1} + gamma_{T-1} * V_T`` and
    ``G_t = r_t + gamma_t * ((1 - lambda_t) * V_{t+1} + lambda_t * G_{t+1})``.

    Per-step ``gammas`` encode terminations (``gamma * (1 - terminated_t)`` stops both the bootstrap and the
    recursion at a terminal step). A truncation inside the sequence cannot be expressed here, because
    ``V_{t+1}`` would be the value of the next episode's first observation: cut sequences at truncations, so a
    truncation can only be the last step, with ``V_T`` the value of the real final observation.

    Args:
        bootstrap_values: ``V(s_0) ... V(s_T)``; only ``V(s_1) ... V(s_T)`` are used.
        rewards: ``r_0 ... r_{T-1}``.
        gammas: Discount per step, a float or a tensor like ``rewards``.
        lambda_: lambda per step, a float or a tensor like ``rewards``.

    Returns:
        The lambda-returns ``G_0 ... G_{T-1}``.

    Shapes:
        - bootstrap_values: :math:`(T + 1, B)`
        - rewards: :math:`(T, B)`
        - gammas, lambda_: float or :math:`(T, B)`
        - output: :math:`(T, B)`

    Raises:
        ValueError: ``bootstrap_values`` does not have one more step than ``rewards``.
    """
    if bootstrap_values.shape[0] != rewards.shape[0] + 1 or bootstrap_values.shape[1:] != rewards.shape[1:]:
        raise ValueError(
            f"generalized_lambda_returns: bootstrap_values has shape {tuple(bootstrap_values.shape)} and rewards "
            f"{tuple(rewards.shape)}; expected bootstrap_values (T + 1, B) = ({rewards.shape[0] + 1}, ...) for "
            f"rewards (T, B)"
        )
    gammas = torch.as_tensor(gammas, dtype=rewards.dtype, device=rewards.device).expand_as(rewards)
    lambda_ = torch.as_tensor(lambda_, dtype=rewards.dtype, device=rewards.device).expand_as(rewards)
    next_values = bootstrap_values[1:]
    returns = torch.empty_like(rewards)
    returns[-1] = rewards[-1] + gammas[-1] * next_values[-1]
    for t in reversed(range(rewards.shape[0] - 1)):
        mixed = (1 - lambda_[t]) * next_values[t] + lambda_[t] * returns[t + 1]
        returns[t] = rewards[t] + gammas[t] * mixed
    return returns


def td_lambda_error(data: td_lambda_data, gamma: float = 0.9, lambda_: float = 0.8) -> torch.Tensor:
    """TD(lambda) value loss: ``0.5 * mean(weight * (G^lambda_t - V(s_t))^2)`` with detached lambda-returns.

    Args:
        data: ``td_lambda_data(value, reward, done, weight)``; ``value`` holds ``V(s_0) ... V(s_T)``, ``done``
            is *terminated* per step (may be ``None``: no termination), ``weight`` may be ``None``. See
            :func:`generalized_lambda_returns` for why truncation may only occur at the last step.
        gamma: Discount factor.
        lambda_: The lambda of TD(lambda).

    Returns:
        The weighted loss (a scalar).

    Shapes:
        - value: :math:`(T + 1, B)`
        - reward, done, weight: :math:`(T, B)`
        - output: scalar
    """
    value, reward, done, weight = data
    not_done = 1.0 if done is None else 1.0 - done.to(reward.dtype)
    with torch.no_grad():
        returns = generalized_lambda_returns(value.detach(), reward, gamma * not_done, lambda_)
    return 0.5 * weighted_mean((returns - value[:-1]).square(), weight)
