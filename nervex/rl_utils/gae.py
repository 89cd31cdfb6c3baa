"""Generalized Advantage Estimation (Schulman et al., 2016) with terminations and truncations kept apart."""

from __future__ import annotations

from collections import namedtuple

import numpy as np
import torch

gae_data = namedtuple("gae_data", ["value", "next_value", "reward", "terminated", "truncated"])


def gae(data: gae_data, gamma: float = 0.99, lambda_: float = 0.97) -> torch.Tensor:
    """Generalized advantage estimates over the time dimension.

    ``delta_t = r_t + gamma * (1 - terminated_t) * next_value_t - value_t`` and
    ``adv_t = delta_t + gamma * lambda_ * (1 - episode_end_t) * adv_{t+1}`` with
    ``episode_end_t = terminated_t or truncated_t``:

    - a terminated step does not bootstrap and does not look past the episode's end;
    - a truncated step still bootstraps from ``next_value_t``, which must therefore be the value of the real
      final observation (not of the next episode's first one), but the recursion stops there too;
    - the last step of the sequence bootstraps from ``next_value_{T-1}`` (the sequence may be cut mid-episode).

    Taking ``next_value`` per step (rather than ``value[t + 1]``) is what lets a truncation sit anywhere in the
    sequence, several episodes share one array, and a cut sequence end bootstrap correctly.

    Args:
        data: ``gae_data(value, next_value, reward, terminated, truncated)``: torch tensors, or NumPy arrays (the
            result is then a NumPy array); ``terminated``/``truncated`` may be bool or float.
        gamma: Discount factor.
        lambda_: The GAE lambda (0: one-step TD error, 1: Monte-Carlo return minus value).

    Returns:
        The advantages ``adv``; the value targets are ``adv + value``.

    Shapes:
        - value, next_value, reward, terminated, truncated: :math:`(T, B)` (or :math:`(T,)`, or any
          :math:`(T, *)` as long as they all match)
        - output: same as ``value``

    Raises:
        ValueError: the fields do not all have the same shape.
    """
    value, next_value, reward, terminated, truncated = data
    shapes = {name: tuple(t.shape) for name, t in zip(gae_data._fields, data)}
    if len(set(shapes.values())) != 1:
        raise ValueError(f"gae: every field of gae_data must have the same (T, B) shape, got {shapes}")
    if isinstance(value, torch.Tensor):
        dtype = value.dtype
        not_terminated = 1.0 - terminated.to(dtype)
        not_end = not_terminated * (1.0 - truncated.to(dtype))
        delta = reward.to(dtype) + gamma * not_terminated * next_value - value
        adv = torch.empty_like(delta)
        running = torch.zeros_like(delta[0])
    else:
        # NumPy arrays: the actor's per-trajectory GAE, where one torch op per step would cost more than the math
        dtype = np.result_type(value.dtype, np.float32)
        not_terminated = 1.0 - np.asarray(terminated, dtype=dtype)
        not_end = not_terminated * (1.0 - np.asarray(truncated, dtype=dtype))
        delta = np.asarray(reward, dtype=dtype) + gamma * not_terminated * next_value - value
        adv = np.empty_like(delta)
        running = np.zeros_like(delta[0])
    decay = gamma * lambda_
    for t in reversed(range(delta.shape[0])):
        running = delta[t] + decay * not_end[t] * running
        adv[t] = running
    return adv
