"""Adder: turns the actor's trajectory cache into train samples (see docs/internals.md, "Transitions and train
samples").

Samples are NumPy and Python values (the replay buffer converts them to tensors); ``get_gae`` calls ``gae`` with
NumPy arrays, so the arithmetic lives in one place. The Adder never mutates the transitions it is given, because ``get_traj`` pushes the same
transition objects back into the cache so that consecutive trajectories overlap; every method that changes a field
returns new (shallow-copied) dicts.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any, Dict, List, Sequence

import numpy as np

from .gae import gae, gae_data

Transition = Dict[str, Any]
# Fields a window's sample takes from the window's last transition rather than from its first.
_WINDOW_END_KEYS = ("next_obs", "terminated", "truncated", "done")


class Adder:
    """Cuts trajectories into n-step, GAE and sequence train samples.

    Args:
        use_cuda: Stored for the policy's use (it moves batches to the GPU); the Adder itself stays on NumPy.
        unroll_len: Length of the sequences ``get_train_sample`` returns; 1 returns transitions as they are.

    Example:
        >>> adder = Adder(use_cuda=False, unroll_len=1)
        >>> data = adder.get_traj(traj_cache, traj_len=64, return_num=nstep - 1)
        >>> data = adder.get_nstep_return_data(data, nstep, gamma=0.99)
        >>> samples = adder.get_train_sample(data)
    """

    def __init__(self, use_cuda: bool = False, unroll_len: int = 1) -> None:
        if unroll_len < 1:
            raise ValueError(f"Adder: unroll_len must be >= 1, got {unroll_len}")
        self.use_cuda = use_cuda
        self.unroll_len = unroll_len

    def get_traj(self, traj_cache: deque, traj_len: float, return_num: int = 0) -> List[Transition]:
        """Pop up to ``traj_len`` transitions from the left of the cache; push the last ``return_num`` back.

        The pushed-back transitions start the next trajectory, so n-step windows that reach past this one can be
        completed next time (use ``return_num = nstep - 1``).

        Args:
            traj_cache: The actor's per-env deque of transitions; modified in place.
            traj_len: Most transitions to take (``float('inf')`` or ``'inf'`` takes all).
            return_num: How many of the taken transitions go back to the front of the cache (capped at the
                number taken).

        Returns:
            The taken transitions, oldest first (the same objects as in the cache).

        Shapes:
            - output: list of ``min(traj_len, len(traj_cache))`` transitions

        Raises:
            ValueError: ``return_num`` is negative, or not below ``traj_len`` (the cache would never shrink).
        """
        if traj_len == "inf":  # nerveX configs write an unbounded trajectory as the string 'inf'
            traj_len = math.inf
        if return_num < 0 or return_num >= traj_len:
            raise ValueError(
                f"Adder.get_traj: return_num={return_num} must be in [0, traj_len) with traj_len={traj_len}, "
                f"otherwise the cache never shrinks; use return_num = nstep - 1 and traj_len >= nstep"
            )
        num = len(traj_cache) if math.isinf(traj_len) else min(int(traj_len), len(traj_cache))
        traj = [traj_cache.popleft() for _ in range(num)]
        for transition in reversed(traj[len(traj) - min(return_num, len(traj)) :]):
            traj_cache.appendleft(transition)
        return traj

    def get_nstep_return_data(
        self,
        data: Sequence[Transition],
        nstep: int,
        traj_len: float | None = None,
        gamma: float | None = None,
    ) -> List[Transition]:
        """Turn each transition into an n-step sample.

        The window of transition ``i`` is ``data[i : i + nstep]``, stopping after the first transition whose
        ``done`` is set (terminated or truncated). Each sample is a shallow copy of ``data[i]`` with

        - ``reward``: ``float32`` array of the window's rewards, zero-padded to ``nstep`` (also for ``nstep == 1``,
          so every sample has the same shape);
        - ``next_obs``, ``terminated``, ``truncated``, ``done``: from the window's last transition;
        - ``value_gamma`` (only with ``gamma``): ``np.float32(gamma ** k)``, ``k`` the window length, so that a
          window cut by truncation bootstraps with the right discount.

        If ``data[-1]`` is not ``done`` the trajectory was cut mid-episode: only the first
        ``len(data) - (nstep - 1)`` samples (those with a complete window) are returned; the caller keeps the last
        ``nstep - 1`` transitions for the next call (``get_traj(..., return_num=nstep - 1)``).

        Args:
            data: Consecutive transitions of one env.
            nstep: Window length, >= 1.
            traj_len: Unused; kept for the nerveX signature (the episode's end is read from ``done``).
            gamma: Discount factor; when given, samples get ``value_gamma``.

        Returns:
            New sample dicts; ``data`` is not modified.

        Shapes:
            - reward of a sample: :math:`(nstep,)` for a float reward, :math:`(nstep, *)` for an array reward

        Raises:
            ValueError: ``nstep`` < 1.
        """
        if nstep < 1:
            raise ValueError(f"Adder.get_nstep_return_data: nstep must be >= 1, got {nstep}")
        data = list(data)
        if not data:
            return []
        num = len(data) if data[-1]["done"] else max(0, len(data) - (nstep - 1))
        return [self._nstep_sample(data, i, nstep, gamma) for i in range(num)]

    @staticmethod
    def _nstep_sample(data: List[Transition], start: int, nstep: int, gamma: float | None) -> Transition:
        """Build the n-step sample of the window starting at ``data[start]``."""
        end = start
        while end < start + nstep - 1 and end < len(data) - 1 and not data[end]["done"]:
            end += 1
        window = data[start : end + 1]
        first_reward = np.asarray(window[0]["reward"], dtype=np.float32)
        reward = np.zeros((nstep,) + first_reward.shape, dtype=np.float32)
        for k, transition in enumerate(window):
            reward[k] = transition["reward"]
        sample = dict(data[start])
        sample["reward"] = reward
        for key in _WINDOW_END_KEYS:
            if key in window[-1]:
                sample[key] = window[-1][key]
        if gamma is not None:
            sample["value_gamma"] = np.float32(gamma ** len(window))
        return sample

    def get_train_sample(self, data: Sequence[Transition]) -> List[Transition]:
        """Return the samples as they are (``unroll_len == 1``) or cut into sequences of ``unroll_len``.

        Sequences are consecutive chunks of ``unroll_len`` samples, each returned as one dict whose fields are
        arrays stacked along a new leading time dim (dict fields are stacked key by key, ``None`` stays ``None``;
        ``float64`` becomes ``float32``). An incomplete last chunk is padded by repeating its last sample; every
        chunk gets ``mask`` (``float32``, 1 for real steps, 0 for padding) so losses can ignore the padding.

        Args:
            data: Samples (transitions or n-step samples), all with the same keys.

        Returns:
            ``list(data)`` for ``unroll_len == 1``, else ``ceil(len(data) / unroll_len)`` sequence dicts.

        Shapes:
            - a field of a sequence: :math:`(unroll\\_len, *)` where the sample's field is :math:`(*)`
            - mask: :math:`(unroll\\_len,)`
        """
        data = list(data)
        if self.unroll_len == 1:
            return data
        sequences = []
        for start in range(0, len(data), self.unroll_len):
            chunk = data[start : start + self.unroll_len]
            real_len = len(chunk)
            chunk = chunk + [chunk[-1]] * (self.unroll_len - real_len)
            sequence = _stack_dicts(chunk)
            mask = np.zeros(self.unroll_len, dtype=np.float32)
            mask[:real_len] = 1.0
            sequence["mask"] = mask
            sequences.append(sequence)
        return sequences

    def get_gae(
        self, data: Sequence[Transition], last_value: float, gamma: float, gae_lambda: float
    ) -> List[Transition]:
        """Add GAE advantages (``adv``) and value targets (``return = adv + value``) to on-policy transitions.

        Each transition must hold ``value`` (``V(obs)`` from collection). The value of a step's next observation
        is taken as follows:

        - a ``terminated`` step: not used (no bootstrap);
        - a step carrying ``next_value``: that value (how a truncation in the middle of ``data`` is handled);
        - the last step of ``data`` (truncated, or cut mid-episode): ``last_value``, which the caller computes as
          ``V(data[-1]['next_obs'])`` (ignored when the last step is terminated);
        - any other step: ``data[t + 1]['value']``.

        The advantage recursion stops at every ``done`` (terminated or truncated), so it never crosses episodes.

        Args:
            data: Consecutive transitions of one env with ``value``, ``reward``, ``terminated``, ``truncated``.
            last_value: ``V`` of the final ``next_obs``.
            gamma: Discount factor.
            gae_lambda: GAE lambda.

        Returns:
            New transition dicts (shallow copies) with ``adv`` and ``return`` (``float32``, shaped like ``value``).

        Shapes:
            - value of a transition: scalar or :math:`(*)`; ``adv`` and ``return`` have the same shape

        Raises:
            ValueError: a truncated step other than the last has no ``next_value``.
        """
        data = list(data)
        if not data:
            return []
        value = np.array([tr["value"] for tr in data], dtype=np.float32)
        terminated = np.array([tr["terminated"] for tr in data], dtype=bool)
        truncated = np.array([tr["truncated"] for tr in data], dtype=bool)
        reward = np.array([tr["reward"] for tr in data], dtype=np.float32)
        next_value = np.empty_like(value)
        next_value[:-1] = value[1:]
        next_value[-1] = last_value
        given = [t for t, tr in enumerate(data) if "next_value" in tr]
        for t in given:
            next_value[t] = np.asarray(data[t]["next_value"], dtype=np.float32).reshape(value.shape[1:])
        missing = truncated[:-1] & ~terminated[:-1]
        missing[given[:-1] if given and given[-1] == len(data) - 1 else given] = False
        if missing.any():
            t = int(np.flatnonzero(missing)[0])
            raise ValueError(
                f"Adder.get_gae: transition {t} of {len(data)} is truncated but is not the last one and has no "
                f"'next_value'; store V(next_obs) as 'next_value' in truncated transitions, or end the data there"
            )
        next_value[terminated] = 0.0
        fields = []
        for field in (reward, terminated, truncated):
            # A per-step scalar (the usual reward and flags) applies to every element of a vector value.
            field = field.reshape(field.shape + (1,) * (value.ndim - field.ndim))
            fields.append(np.broadcast_to(field, value.shape))
        adv = gae(gae_data(value, next_value, *fields), gamma, gae_lambda)
        ret = adv + value
        samples = []
        for t, transition in enumerate(data):
            sample = dict(transition)
            sample["adv"] = adv[t]
            sample["return"] = ret[t]
            samples.append(sample)
        return samples


def _stack_dicts(chunk: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Stack the fields of a list of dicts along a new leading axis (recursively for dict fields)."""
    stacked = {}
    for key in chunk[0]:
        if any(key not in d for d in chunk):
            raise KeyError(
                f"Adder.get_train_sample: field '{key}' is missing from some samples; all need the same keys"
            )
        values = [d[key] for d in chunk]
        if isinstance(values[0], dict):
            stacked[key] = _stack_dicts(values)
        elif all(v is None for v in values):
            stacked[key] = None
        else:
            array = np.stack([np.asarray(v) for v in values])
            stacked[key] = array.astype(np.float32) if array.dtype == np.float64 else array
    return stacked
