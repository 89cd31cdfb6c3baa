"""Adder: turns transitions into train samples (see docs/internals.md, "Transitions and train samples").

Two ways in:

- **streaming** (what the actor uses): an Adder built with a ``kind`` owns every env's trajectory buffer. The actor
  calls ``add_first(env_id)`` when an env starts an episode, ``add(env_id, transition)`` after each step (it returns
  the samples that transition completed) and ``flush(env_id)`` at the end of an on-policy rollout. The kinds:

  - ``'nstep'``: one n-step transition per step (reward window zero-padded to ``nstep``, ``value_gamma``), emitted
    as soon as its window is complete, the episode's tail at its end;
  - ``'gae'``: on-policy transitions with ``adv`` and ``return``, emitted at an episode's end and by ``flush``;
  - ``'sequence'``: overlapping sequences of ``burnin + unroll_len + lookahead`` steps, with the recurrent state at
    each sequence's start, for recurrent and V-trace learners (``_sequences`` explains the layout);
  - ``'episode'``: each whole episode as one sample of ``unroll_len + 1`` steps (``unroll_len``: the longest episode),
    emitted at its end; the step after its last holds the final observation (on-policy COMA).

- **functional** (the nerveX API, for policies that implement ``_get_train_sample(traj_cache)`` themselves):
  ``get_traj``, ``get_nstep_return_data``, ``get_gae`` and ``get_train_sample`` transform lists of transitions.

Samples are NumPy and Python values (the replay buffer converts them to tensors); ``get_gae`` calls ``gae`` with
NumPy arrays, so the arithmetic lives in one place. The Adder never mutates the transitions it is given (the actor
keeps references to them, and ``get_traj`` pushes the same objects back into a cache); every method that changes a
field returns new (shallow-copied) dicts.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .gae import gae, gae_data

Transition = Dict[str, Any]
# Fields a window's sample takes from the window's last transition rather than from its first.
_WINDOW_END_KEYS = ("next_obs", "terminated", "truncated", "done")
KINDS = ("nstep", "gae", "sequence", "episode")


class Adder:
    """Cuts trajectories into n-step, GAE and sequence train samples.

    Args:
        use_cuda: Stored for the policy's use (it moves batches to the GPU); the Adder itself stays on NumPy.
        unroll_len: Sequence length: of ``get_train_sample``'s chunks (1 returns transitions as they are), of a
            ``'sequence'`` sample's learning window, and the longest episode of kind ``'episode'``.
        kind: What ``add``/``flush`` produce: ``'nstep'``, ``'gae'``, ``'sequence'`` or ``'episode'``; None for an
            Adder used only through the functional methods.
        nstep: ``'nstep'``: window length.
        gamma: ``'nstep'``: the discount of ``value_gamma`` (omitted: no ``value_gamma``); ``'gae'``: required.
        gae_lambda: ``'gae'``: GAE's lambda (required).
        burnin: ``'sequence'``: steps before each learning window that only warm up the recurrent state.
        lookahead: ``'sequence'``: steps after each learning window (n-step targets, a V-trace bootstrap).
        first_only: ``'sequence'``: fields taken from a sequence's first step instead of stacked over its steps
            (the recurrent state the actor had there).
        keep: Fields a sample keeps (None: all); applied to every kind's samples.

    Example:
        >>> adder = Adder(kind="nstep", nstep=3, gamma=0.99)
        >>> adder.add_first(env_id=0)
        >>> samples = adder.add(0, transition)  # [] until a window of 3 steps (or the episode) is complete

    Raises:
        ValueError: an unknown ``kind``, or a setting out of range or missing for the kind.
    """

    def __init__(
        self,
        use_cuda: bool = False,
        unroll_len: int = 1,
        *,
        kind: Optional[str] = None,
        nstep: int = 1,
        gamma: Optional[float] = None,
        gae_lambda: Optional[float] = None,
        burnin: int = 0,
        lookahead: int = 0,
        first_only: Sequence[str] = ("prev_state",),
        keep: Optional[Sequence[str]] = None,
    ) -> None:
        if unroll_len < 1:
            raise ValueError(f"Adder: unroll_len must be >= 1, got {unroll_len}")
        if kind is not None and kind not in KINDS:
            raise ValueError(f"Adder: unknown kind {kind!r}; valid: {', '.join(KINDS)}")
        if nstep < 1:
            raise ValueError(f"Adder: nstep must be >= 1, got {nstep}")
        if burnin < 0 or lookahead < 0:
            raise ValueError(f"Adder: burnin and lookahead must be >= 0, got burnin={burnin}, lookahead={lookahead}")
        if kind == "gae" and (gamma is None or gae_lambda is None):
            raise ValueError("Adder(kind='gae') needs gamma and gae_lambda")
        if kind == "episode":
            if burnin or lookahead:
                raise ValueError("Adder(kind='episode') takes whole episodes: no burnin or lookahead")
            lookahead = 1  # the padding step after an episode's last one holds its final observation
        self.use_cuda = use_cuda
        self.unroll_len = int(unroll_len)
        self.kind = kind
        self.nstep = int(nstep)
        self.gamma = None if gamma is None else float(gamma)
        self.gae_lambda = None if gae_lambda is None else float(gae_lambda)
        self.burnin = int(burnin)
        self.lookahead = int(lookahead)
        self.first_only = tuple(first_only)
        self.keep = None if keep is None else tuple(keep)
        # per env: the transitions not yet emitted (or still needed by a later sample), oldest first
        self._traj: Dict[int, List[Transition]] = {}
        # 'sequence' per env: (episode step of _traj[0], episode step where the next learning window starts)
        self._position: Dict[int, Tuple[int, int]] = {}

    @property
    def sequence_len(self) -> int:
        """Steps of a ``'sequence'`` sample: ``burnin + unroll_len + lookahead``."""
        return self.burnin + self.unroll_len + self.lookahead

    # ---- streaming ------------------------------------------------------------------------------------------
    def _require_kind(self, method: str) -> None:
        if self.kind is None:
            raise RuntimeError(
                f"Adder.{method} needs an Adder built with kind= ({', '.join(KINDS)}); this one only has the "
                f"functional methods (get_traj, get_nstep_return_data, get_gae, get_train_sample)"
            )

    def add_first(self, env_id: int) -> None:
        """An episode starts in env ``env_id``: whatever the env's buffer holds (an episode cut by an env crash) is
        dropped."""
        self._require_kind("add_first")
        self._traj.pop(env_id, None)
        self._position.pop(env_id, None)

    def reset(self) -> None:
        """Drop every env's buffer (the actor restarts its envs)."""
        self._traj.clear()
        self._position.clear()

    def pending(self, env_id: int) -> int:
        """Transitions of ``env_id`` held (not yet emitted, or kept for a later sample's burn-in)."""
        return len(self._traj.get(env_id, ()))

    def add(self, env_id: int, transition: Transition) -> List[Transition]:
        """Add one env's next transition; return the samples it completed (possibly none).

        The transition needs ``done`` (and ``terminated``/``truncated``); ``'nstep'`` needs ``reward`` (and
        ``next_obs`` for the sample to have one), ``'gae'`` needs ``value`` and, for a truncated transition, the
        actor's ``next_value``; ``'sequence'`` uses ``next_obs`` to pad after an episode's end.
        """
        self._require_kind("add")
        traj = self._traj.setdefault(env_id, [])
        traj.append(transition)
        if self.kind == "nstep":
            return self._keep(self._add_nstep(traj))
        if self.kind == "sequence":
            return self._keep(self._add_sequence(env_id, traj))
        if self.kind == "episode":
            return self._keep(self._add_episode(env_id, traj))
        if transition["done"]:  # 'gae': an episode's end needs no bootstrap beyond what the actor stored
            return self.flush(env_id)
        return []

    def flush(self, env_id: int) -> List[Transition]:
        """Emit what can be emitted now. ``'gae'``: the env's whole buffer (the last transition, unless done, must
        hold the actor's ``next_value``); the buffer is emptied. Other kinds keep incomplete windows for later and
        return nothing."""
        self._require_kind("flush")
        if self.kind != "gae":
            return []
        traj = self._traj.pop(env_id, None)
        if not traj:
            return []
        if not traj[-1]["done"] and "next_value" not in traj[-1]:
            raise RuntimeError(
                f"Adder.flush: env {env_id}'s trajectory ends mid-episode without 'next_value'; the actor must "
                f"bootstrap V(next_obs) of a rollout's last transition before flushing"
            )
        return self._keep(self.get_gae(traj, 0.0, self.gamma, self.gae_lambda))

    def _keep(self, samples: List[Transition]) -> List[Transition]:
        if self.keep is None or not samples:
            return samples
        return [{key: sample[key] for key in self.keep} for sample in samples]

    def _add_nstep(self, traj: List[Transition]) -> List[Transition]:
        if traj[-1]["done"]:
            samples = [self._nstep_sample(traj, i, self.nstep, self.gamma) for i in range(len(traj))]
            traj.clear()
            return samples
        if len(traj) < self.nstep:
            return []
        sample = self._nstep_sample(traj, 0, self.nstep, self.gamma)
        del traj[0]
        return [sample]

    def _add_sequence(self, env_id: int, traj: List[Transition]) -> List[Transition]:
        """Learning windows tile the episode: window k learns episode steps ``[k U, k U + U)``. Its sample covers
        steps ``[s, s + T)``, ``T = burnin + U + lookahead``, with ``b = min(burnin, k U)`` burn-in steps before the
        window (fewer at an episode's start, where the stored state is the episode's initial one) and
        ``s = k U - b``. It is emitted once step ``s + b + U + lookahead - 1`` is added, or at the episode's end,
        padded (``_sequence_sample``)."""
        offset, learn = self._position.get(env_id, (0, 0))
        samples = []
        end = offset + len(traj)  # episode steps held: [offset, end)
        done = bool(traj[-1]["done"])
        while learn < end and (done or learn + self.unroll_len + self.lookahead <= end):
            b = min(self.burnin, learn)
            start = learn - b
            stop = min(learn + self.unroll_len + self.lookahead, end)
            samples.append(self._sequence_sample(traj[start - offset : stop - offset], b))
            learn += self.unroll_len
        if done:
            self._traj.pop(env_id, None)
            self._position.pop(env_id, None)
            return samples
        keep_from = learn - min(self.burnin, learn)  # the next sample's first step
        if keep_from > offset:
            del traj[: keep_from - offset]
            offset = keep_from
        self._position[env_id] = (offset, learn)
        return samples

    def _add_episode(self, env_id: int, traj: List[Transition]) -> List[Transition]:
        """The whole episode as one padded sample at its end (``_sequence_sample``); nothing before."""
        if len(traj) > self.unroll_len:
            self._traj.pop(env_id, None)
            raise ValueError(
                f"Adder(kind='episode'): env {env_id}'s episode ran past unroll_len={self.unroll_len} steps; an "
                "episode sample holds at most unroll_len steps: raise it to the env's time limit (COMA: "
                "policy.max_episode_len)"
            )
        if not traj[-1]["done"]:
            return []
        self._traj.pop(env_id, None)
        return [self._sequence_sample(traj, 0)]

    def _sequence_sample(self, steps: List[Transition], burnin: int) -> Transition:
        """Stack ``steps`` into one sample of ``sequence_len`` steps.

        Every field gets a leading time axis, except ``next_obs`` (dropped) and the ``first_only`` fields (from the
        first step). Steps past the given ones are padding: copies of the last step with ``obs`` set to its
        ``next_obs`` (so the observation after an episode's last step, a truncated end's bootstrap, is in the
        sample) and zero reward. ``mask`` marks real steps; ``burnin`` is how many steps precede the learning window.
        """
        length = self.sequence_len
        real = len(steps)
        if real < length:
            last = steps[-1]
            pad = {k: v for k, v in last.items()}
            if "next_obs" in last:
                pad["obs"] = last["next_obs"]
            if "reward" in last:
                pad["reward"] = np.zeros_like(np.asarray(last["reward"], dtype=np.float32))
            steps = list(steps) + [pad] * (length - real)
        first = steps[0]
        drop = set(self.first_only) | {"next_obs"}
        sample = _stack_dicts([{k: v for k, v in step.items() if k not in drop} for step in steps])
        for key in self.first_only:
            if key in first:
                sample[key] = first[key]
        mask = np.zeros(length, dtype=np.float32)
        mask[:real] = 1.0
        sample["mask"] = mask
        sample["burnin"] = np.int64(burnin)
        return sample

    # ---- functional (nerveX) API ------------------------------------------------------------------------------
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
        next_value = _next_values(data, value, terminated, truncated, last_value)
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


def _next_values(
    data: List[Transition], value: np.ndarray, terminated: np.ndarray, truncated: np.ndarray, last_value: float
) -> np.ndarray:
    """``V`` of each step's next observation for ``Adder.get_gae`` (its docstring lists the cases); 0 where
    terminated. Raises ``ValueError`` for a truncated step other than the last without ``next_value``."""
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
    return next_value


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
