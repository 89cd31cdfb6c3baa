"""Helpers of the many-agent env contract: per-agent arrays, team reductions, legal random actions.

An env with several agents (or seats of a game) names them in ``BaseEnvInfo.agent_ids``; per-agent values (rewards,
returns, outcomes) travel as arrays ordered like ``agent_ids``. These helpers turn an env's dict keyed by agent id
into that array, reduce it to the team's value as ``BaseEnvInfo.team_reward`` says, and draw a uniformly random
*legal* action under an action mask (the random warm-up and the ``random`` act-only slot use it).

A cooperative (simultaneous-move) env with ``N`` agents, as its adapters give it (``TwoStepGameEnv`` is the smallest
example; the PettingZoo ``ParallelEnv``, LBF and VMAS adapters follow the same layout):

- observation: a dict ``{'obs': (N, obs_dim) float32, 'global_state': (state_dim,) float32, 'action_mask': (N, A)
  int8 (discrete actions; 1 = legal), 'alive': (N,) int8 (1 while the agent is in the episode)}``; ``obs`` rows of
  agents with smaller observations are zero-padded to the widest; ``action_mask`` and ``alive`` may be absent (all
  legal, all alive);
- action: ``(N,)`` int64 under a ``MultiDiscrete`` space, or ``(N, act_dim)`` float32 under a ``Box`` of that shape;
- reward: ``(N,)`` float, one per agent; the team's is ``team_value(reward, info.team_reward)`` (cooperative policies
  take ``policy.team_reward: env`` to learn from that reduction);
- ``info['episode_return']`` at the end: ``(N,)``; optional per-episode figures the env measures (a coverage rate, a
  win flag) travel in ``info['episode_stats']``, a dict of floats, and are logged as ``rollout/<name>`` and
  ``eval/<name>``.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence, Tuple, Union

import gymnasium as gym
import numpy as np

from .base_env import BaseEnvInfo

TEAM_REDUCTIONS = ("sum", "mean")


def agent_array(value: Any, agent_ids: Sequence[str], dtype: Any = np.float64) -> np.ndarray:
    """One entry per agent, ordered as ``agent_ids``: ``{'b': 2, 'a': 1}`` with ids ``('a', 'b')`` -> ``[1., 2.]``.

    Args:
        value: A mapping keyed by agent id, or an array-like whose leading axis already follows ``agent_ids``.
        agent_ids: The env's agents in order (``BaseEnvInfo.agent_ids``).
        dtype: The array's dtype.

    Returns:
        An array shaped ``(len(agent_ids), *entry_shape)``.

    Raises:
        KeyError: a mapping misses an agent or holds an id not in ``agent_ids`` (both named).
        ValueError: an array-like's leading axis is not ``len(agent_ids)``.
    """
    ids = tuple(agent_ids)
    if isinstance(value, Mapping):
        unknown = [k for k in value if k not in ids]
        if unknown:
            raise KeyError(f"agent_array: unknown agent id(s) {unknown}; the env's agent_ids are {list(ids)}")
        missing = [a for a in ids if a not in value]
        if missing:
            raise KeyError(f"agent_array: no value for agent(s) {missing}; a value per agent of {list(ids)} is needed")
        return np.asarray([value[a] for a in ids], dtype=dtype)
    array = np.asarray(value, dtype=dtype)
    if array.ndim == 0 or array.shape[0] != len(ids):
        raise ValueError(
            f"agent_array: a value of shape {array.shape} has no leading axis of one entry per agent "
            f"({len(ids)} agents: {list(ids)}); pass a dict keyed by agent id or an array shaped ({len(ids)}, ...)"
        )
    return array


def team_value(value: Union[float, np.ndarray, Sequence[float]], how: str = "sum") -> float:
    """The team's reward or return: the ``how`` (``'sum'`` | ``'mean'``) of per-agent values; a scalar stays itself.

    Raises:
        ValueError: ``how`` is neither ``'sum'`` nor ``'mean'``, or ``value`` is empty.
    """
    if how not in TEAM_REDUCTIONS:
        raise ValueError(
            f"team_value: unknown reduction {how!r}; BaseEnvInfo.team_reward must be one of {TEAM_REDUCTIONS}"
        )
    array = np.asarray(value, dtype=np.float64)
    if array.ndim == 0:
        return float(array)
    if array.size == 0:
        raise ValueError("team_value: no per-agent values to reduce (an empty array)")
    return float(array.sum() if how == "sum" else array.mean())


def reward_shape(info: BaseEnvInfo) -> Tuple[int, ...]:
    """The shape of one step's reward: ``()`` for a scalar (no ``rew_space`` or a shape-``()`` one), else its shape."""
    space = info.rew_space
    if space is None or space.shape is None:
        return ()
    return tuple(space.shape)


def _legal_indices(mask: np.ndarray, n: int, where: str) -> np.ndarray:
    if mask.shape != (n,):
        raise ValueError(f"sample_action: {where} action_mask of shape {mask.shape}; the action space needs ({n},)")
    legal = np.flatnonzero(mask)
    if legal.size == 0:
        raise ValueError(f"sample_action: {where} action_mask allows no action (all {n} entries are 0)")
    return legal


def _sample_box(space: gym.spaces.Box, rng: np.random.Generator) -> np.ndarray:
    low, high = space.low.astype(np.float64), space.high.astype(np.float64)
    if space.dtype.kind in "iu":
        return rng.integers(low.astype(np.int64), high.astype(np.int64), endpoint=True).astype(space.dtype)
    # Gymnasium's rule for unbounded sides: normal where both are infinite, shifted exponential where one is
    sample = rng.standard_normal(space.shape)
    lower_only = np.isfinite(low) & ~np.isfinite(high)
    upper_only = ~np.isfinite(low) & np.isfinite(high)
    bounded = np.isfinite(low) & np.isfinite(high)
    sample[lower_only] = low[lower_only] + rng.exponential(size=int(lower_only.sum()))
    sample[upper_only] = high[upper_only] - rng.exponential(size=int(upper_only.sum()))
    sample[bounded] = rng.uniform(low[bounded], high[bounded])
    return sample.astype(space.dtype)


def sample_action(space: gym.Space, action_mask: Optional[Any], rng: np.random.Generator) -> Any:
    """A uniformly random legal action of ``space``.

    Args:
        space: ``Discrete`` (mask ``(n,)``), ``MultiDiscrete`` with a 1-D ``nvec`` (one entry per agent; mask
            ``(agent_num, max(nvec))``, columns past an agent's own size are ignored), ``MultiBinary`` or ``Box``
            (no mask).
        action_mask: 1 (or True) marks a legal action; ``None`` = every action is legal.
        rng: The generator to draw from (the caller seeds it).

    Returns:
        An ``np.int64`` for ``Discrete``, an ``int64`` array for ``MultiDiscrete``, an array of the space's dtype
        for ``Box`` / ``MultiBinary``.

    Raises:
        ValueError: a mask of the wrong shape, a mask allowing no action, or a mask for a space without one.
        TypeError: another space type.
    """
    mask = None if action_mask is None else np.asarray(action_mask)
    if isinstance(space, gym.spaces.Discrete):
        n, start = int(space.n), int(space.start)
        if mask is None:
            return np.int64(start + rng.integers(n))
        return np.int64(start + rng.choice(_legal_indices(mask, n, "a")))
    if isinstance(space, gym.spaces.MultiDiscrete) and space.nvec.ndim == 1:
        nvec, start = space.nvec.astype(np.int64), space.start.astype(np.int64)
        if mask is None:
            return start + rng.integers(nvec)
        width = int(nvec.max())
        if mask.shape != (len(nvec), width):
            raise ValueError(
                f"sample_action: action_mask of shape {mask.shape}; MultiDiscrete {nvec.tolist()} needs one row "
                f"per agent, shaped ({len(nvec)}, {width})"
            )
        picks = [rng.choice(_legal_indices(mask[i, :n], int(n), f"agent {i}'s")) for i, n in enumerate(nvec)]
        return start + np.asarray(picks, dtype=np.int64)
    if mask is not None:
        raise ValueError(f"sample_action: an action_mask was given for {space}, which has no discrete actions to mask")
    if isinstance(space, gym.spaces.Box):
        return _sample_box(space, rng)
    if isinstance(space, gym.spaces.MultiBinary):
        return rng.integers(0, 2, size=space.shape).astype(space.dtype)
    raise TypeError(
        f"sample_action: unsupported action space {space}; supported: Discrete, MultiDiscrete (1-D nvec), "
        f"MultiBinary, Box"
    )
