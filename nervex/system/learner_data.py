"""What the parallel learner does with the data the coordinator announces: read it, check it, feed the learn loop.

``DataIntake`` owns the learner's poll cursor (``seq``), its data counters, the window of episode returns reported
with the data, and the off-policy replay-ratio credit:

* each announced samples file is read from the storage path (SHA-256 checked) and decoded (``decode_samples``:
  safetensors, never pickle); a file whose snapshot is more than ``system.learner.max_policy_lag`` gradient steps old
  is dropped (``dropped_stale``), one that is gone is ``missing``, one that is malformed or not trainable ``bad_data``;
* off-policy, the samples go to the replay buffer, and once ``learning_starts`` env steps are reached (counting the
  result's own), each env step of a result earns ``update_per_collect / n_sample`` gradient steps (the serial
  trainer's replay ratio and start, whatever size the collect tasks have), which ``train_owed`` spends;
* on-policy, each rollout is trained on as it arrives (every rank on its shard); its samples must share their
  fields, shapes and dtypes with each other and with the rollouts trained on before.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import Any, Callable, Deque, Dict, List, Mapping, Optional, Tuple

import gymnasium as gym
import numpy as np
import torch

from nervex.system.comm.codec import flatten_arrays
from nervex.system.comm.errors import ProtocolError
from nervex.system.comm.storage import Storage
from nervex.system.samples import decode_samples
from nervex.worker.learner.loop import LearnLoop

TRAIN_CHUNK = 64
"""Gradient steps between two polls when much training is owed (keeps snapshots and progress flowing)."""
EPISODE_WINDOW = 100
"""Episodes ``rollout/ep_rew_mean`` and ``rollout/ep_len_mean`` are averaged over."""

Layout = Tuple[Tuple[str, str], ...]

MAX_SAMPLE_MAGNITUDE = 1e9
"""The largest magnitude a float in a sample may have: no env or policy produces more, and a forged 1e32 squared in a
loss overflows float32 and turns the weights NaN."""
OBS_FIELDS = ("obs", "next_obs")
"""The sample fields that hold an observation of the env's observation space (possibly with leading time axes)."""


class SampleCheck:
    """Checks samples against what the env declares, before any reaches the replay buffer or a gradient step.

    ``obs``/``next_obs`` must fit the observation space (a ``Box``: its shape as the trailing axes, within its finite
    bounds; a ``Dict``: each declared key that the sample holds), ``action`` the action space (``Discrete``: integers
    in ``[0, n)``; ``MultiDiscrete``: per entry below ``nvec``; ``Box``: its shape, any finite value, as Gaussian
    policies store unclipped actions), and no float anywhere may exceed ``MAX_SAMPLE_MAGNITUDE``. A file of another
    layout is thus refused on its own values, not only against the first file that happened to arrive.

    In a many-agent env, a single-agent policy over the agents (independent learners) stores one agent's view: a
    sample that does not fit the joint space is checked against one agent's (the ``obs`` entry of a dict space, the
    joint spaces without their leading agent axis, with the loosest bounds over the agents).

    Args:
        obs_space: The env's observation space (``env_info.obs_space``); None skips the observation check.
        act_space: The env's action space; None skips the action check.
        agent_num: The env's agents (``env_info.agent_num``).
    """

    def __init__(self, obs_space: Optional[gym.Space], act_space: Optional[gym.Space], agent_num: int = 1) -> None:
        self.obs_space, self.act_space = obs_space, act_space
        self.agent_num = int(agent_num)
        self._agent_obs = _agent_space(obs_space, self.agent_num, dict_key="obs")
        self._agent_act = _agent_space(act_space, self.agent_num)

    def problem(self, samples: List[Dict[str, Any]]) -> Optional[str]:
        """What does not fit (the field, the first offending sample and value, the bound), or None."""
        if not samples:
            return None
        for name in samples[0]:
            column = _column(samples, name)
            if column is None:
                continue
            if name in OBS_FIELDS and self.obs_space is not None:
                found = self._fit(name, column, self.obs_space, self._agent_obs, action=False)
            elif name == "action" and self.act_space is not None:
                found = self._fit(name, column, self.act_space, self._agent_act, action=True)
            else:
                found = _magnitude_problem(name, column)
            if found is not None:
                return found
        return None

    @staticmethod
    def _fit(name: str, column: Any, space: gym.Space, agent: Optional[gym.Space], action: bool) -> Optional[str]:
        found = _space_problem(name, column, space, action)
        if found is not None and agent is not None and _space_problem(name, column, agent, action) is None:
            return None  # one agent's view (independent learners)
        return found


def _agent_space(space: Optional[gym.Space], agent_num: int, dict_key: str = "") -> Optional[gym.Space]:
    """One agent's part of a joint space (leading axis ``agent_num``), or None where there is none."""
    if space is None or agent_num <= 1:
        return None
    if isinstance(space, gym.spaces.Dict):
        return _agent_space(space.spaces.get(dict_key), agent_num) if dict_key else None
    if isinstance(space, gym.spaces.Box) and space.shape[:1] == (agent_num,):
        return gym.spaces.Box(space.low.min(axis=0), space.high.max(axis=0), dtype=space.dtype)
    if isinstance(space, gym.spaces.MultiDiscrete) and space.nvec.shape[:1] == (agent_num,):
        nvec = np.asarray(space.nvec).max(axis=0)
        return gym.spaces.Discrete(int(nvec)) if nvec.ndim == 0 else gym.spaces.MultiDiscrete(nvec)
    return None


def _column(samples: List[Dict[str, Any]], name: str) -> Optional[Any]:
    """The field over all samples: an array with a leading sample axis, a dict of such columns, or None (not
    numeric, or ragged: the layout check names those)."""
    values = [sample.get(name) for sample in samples]
    if isinstance(values[0], Mapping):
        keys = values[0].keys()
        if not all(isinstance(v, Mapping) and v.keys() == keys for v in values):
            return None
        return {key: _column([dict(v) for v in values], key) for key in keys}
    try:
        array = np.stack([np.asarray(v.detach().cpu() if isinstance(v, torch.Tensor) else v) for v in values])
    except (ValueError, TypeError):
        return None
    return array if array.dtype.kind in "biuf" else None


def _magnitude_problem(name: str, column: Any) -> Optional[str]:
    if isinstance(column, dict):
        for key, sub in column.items():
            found = _magnitude_problem(f"{name}/{key}", sub) if sub is not None else None
            if found is not None:
                return found
        return None
    if column.dtype.kind == "f" and column.size:
        big = np.abs(column) > MAX_SAMPLE_MAGNITUDE
        if big.any():
            index = tuple(int(i) for i in np.argwhere(big)[0])
            return (
                f"field {name!r}: {column[index]:.3g} in sample {index[0]} is beyond +-{MAX_SAMPLE_MAGNITUDE:g} "
                "(no env produces it)"
            )
    return None


def _space_problem(name: str, column: Any, space: gym.Space, action: bool) -> Optional[str]:
    """What of ``column`` (the field over all samples, a leading sample axis) does not fit ``space``."""
    if isinstance(space, gym.spaces.Dict):
        return _dict_problem(name, column, space, action)
    if isinstance(column, dict):
        return f"field {name!r}: a dict where the env's space is {space}"
    found = _magnitude_problem(name, column)
    if found is not None:
        return found
    if isinstance(space, gym.spaces.Discrete):
        return _integer_problem(name, column, (), int(space.start), int(space.start) + int(space.n), space)
    if isinstance(space, gym.spaces.MultiDiscrete):
        nvec = np.asarray(space.nvec)
        start = np.asarray(getattr(space, "start", np.zeros_like(nvec)))
        return _integer_problem(name, column, nvec.shape, start, start + nvec, space)
    if isinstance(space, gym.spaces.MultiBinary):
        return _integer_problem(name, column, tuple(np.atleast_1d(space.n)), 0, 2, space)
    if isinstance(space, gym.spaces.Box):
        return _box_problem(name, column, space, action)
    return None


def _dict_problem(name: str, column: Any, space: gym.spaces.Dict, action: bool) -> Optional[str]:
    if not isinstance(column, dict):
        return f"field {name!r}: the env's space is a dict of {sorted(space.spaces)}, the sample's is not a dict"
    for key, sub in column.items():
        if sub is None:
            continue
        if key in space.spaces:
            found = _space_problem(f"{name}/{key}", sub, space.spaces[key], action)
        else:
            found = _magnitude_problem(f"{name}/{key}", sub)
        if found is not None:
            return found
    return None


def _box_problem(name: str, column: np.ndarray, space: gym.spaces.Box, action: bool) -> Optional[str]:
    shape = tuple(space.shape)
    if column.ndim - 1 < len(shape) or column.shape[column.ndim - len(shape) :] != shape:
        return f"field {name!r}: shape {column.shape[1:]} per sample does not end with the env's {shape}"
    if action:
        return None  # Gaussian policies store unclipped actions: any finite value
    low, high = np.broadcast_to(space.low, shape), np.broadcast_to(space.high, shape)
    outside = (column < low) | (column > high)
    if not outside.any():
        return None
    index = tuple(int(i) for i in np.argwhere(outside)[0])
    inner = index[column.ndim - len(shape) :]
    return (
        f"field {name!r}: {column[index]:.6g} in sample {index[0]} is outside the env's bounds "
        f"[{low[inner]:.6g}, {high[inner]:.6g}] at {list(inner)}"
    )


def _integer_problem(
    name: str, column: np.ndarray, shape: Tuple[int, ...], low: Any, high: Any, space: gym.Space
) -> Optional[str]:
    if column.dtype.kind == "f" and not np.array_equal(column, np.round(column)):
        return f"field {name!r}: {space} takes integers, the samples hold fractions"
    if shape and (column.ndim - 1 < len(shape) or column.shape[column.ndim - len(shape) :] != shape):
        return f"field {name!r}: shape {column.shape[1:]} per sample does not end with the env's {shape}"
    outside = (column < low) | (column >= high)
    if np.any(outside):
        index = tuple(int(i) for i in np.argwhere(outside)[0])
        return f"field {name!r}: {column[index]} in sample {index[0]} is not an action or value of {space}"
    return None


def sample_layout(sample: Mapping[str, Any]) -> Layout:
    """``(leaf, 'shape dtype')`` for each leaf of a sample, sorted: what every sample of a rollout must share."""
    layout = []
    for name, value in flatten_arrays(sample).items():
        if isinstance(value, (torch.Tensor, np.ndarray, np.generic)):
            layout.append((name, f"{tuple(value.shape)} {value.dtype}"))
        else:
            layout.append((name, type(value).__name__))
    return tuple(sorted(layout))


class DataIntake:
    """Reads announced collect results into a learn loop (one per learner rank).

    Args:
        loop: The learn loop the data feeds.
        storage: The run's storage path (samples files).
        max_policy_lag: Drop data whose snapshot is more gradient steps old than this (None: keep all).
        logger: Where skipped data is reported.
        is_main: Rank 0 deletes each file once read.
        barrier: With several ranks, waits until every rank has read the file (before rank 0 deletes it).
        on_trained: Called after each rollout trained on (on-policy): the learner publishes a snapshot.
        check: Checks each file's samples against the env's spaces (``SampleCheck``); None checks nothing.
    """

    def __init__(
        self,
        loop: LearnLoop,
        storage: Storage,
        max_policy_lag: Optional[int],
        logger: logging.Logger,
        is_main: bool = True,
        barrier: Optional[Callable[[], None]] = None,
        on_trained: Optional[Callable[[], None]] = None,
        check: Optional[SampleCheck] = None,
    ) -> None:
        self.loop, self.storage, self.logger = loop, storage, logger
        self.check = check
        self.max_policy_lag = max_policy_lag
        self.is_main, self.barrier, self.on_trained = is_main, barrier, on_trained
        self.on_policy = bool(loop.contract.on_policy)
        learn = loop.contract.learn
        self.batch_size = int(learn.batch_size or 1)
        self.learning_starts = int(learn.learning_starts)
        self.collect_n = max(1, int(loop.contract.collect.n))  # env steps of one serial collection
        self.ratio = float(learn.update_per_collect) / self.collect_n
        self.credit = 0.0
        self.seq = 0
        self.counters: Dict[str, int] = {"results": 0, "dropped_stale": 0, "missing": 0, "bad_data": 0}
        self.episode_returns: Deque[float] = deque(maxlen=EPISODE_WINDOW)
        self.episode_lens: Deque[int] = deque(maxlen=EPISODE_WINDOW)
        self.episode_outcomes: Deque[int] = deque(maxlen=EPISODE_WINDOW)  # games: the learning slot's -1/0/1
        self.outcome_counts: Dict[int, int] = {1: 0, 0: 0, -1: 0}  # every game reported since the learner started
        self._rollout_layout: Optional[Layout] = None  # (on-policy) what was trained on

    def needs_data(self) -> bool:
        """Whether to poll: on-policy always; off-policy once no full gradient step is owed (or can be taken)."""
        if self.on_policy:
            return True
        return self.credit < 1.0 or len(self.loop.buffer) < self.batch_size

    def train_owed(self) -> int:
        """(Off-policy) The gradient steps the credit owes, at most ``TRAIN_CHUNK``; returns those taken."""
        if self.on_policy:
            return 0
        steps = self.loop.train_off_policy(min(int(self.credit), TRAIN_CHUNK)).steps
        self.credit -= steps
        return steps

    def figures(self) -> Dict[str, float]:
        """``data/<counter>``, and ``rollout/ep_rew_mean`` / ``rollout/ep_len_mean`` over the last episodes; for
        games, ``rollout/win_rate`` over them and ``rollout/wins``/``draws``/``losses`` (as the serial actor's)."""
        figures = {f"data/{k}": float(v) for k, v in self.counters.items()}
        if self.episode_returns:
            figures["rollout/ep_rew_mean"] = float(np.mean(self.episode_returns))
            figures["rollout/ep_len_mean"] = float(np.mean(self.episode_lens))
        if self.episode_outcomes:
            figures["rollout/win_rate"] = float(np.mean([o == 1 for o in self.episode_outcomes]))
            for outcome, name in ((1, "wins"), (0, "draws"), (-1, "losses")):
                figures[f"rollout/{name}"] = float(self.outcome_counts[outcome])
        return figures

    # ---- ingestion -----------------------------------------------------------------------------------------------
    def ingest(self, items: List[Mapping[str, Any]]) -> int:
        """Read each polled item (``{'seq', 'task_id', 'result'}``) into the loop; returns how many were used."""
        count = 0
        for item in items:
            self.seq = max(self.seq, int(item["seq"]))
            result, task_id = item["result"], item.get("task_id", "?")
            samples = self._read(result, task_id)
            if self.barrier is not None:
                self.barrier()  # every rank has read the file before rank 0 deletes it
            if self.is_main:
                self.storage.delete(result["data"])
            env_steps = int(result["env_steps"])
            self.loop.env_step += env_steps
            for episode in result.get("episodes", []):
                self.episode_returns.append(float(episode["return"]))
                self.episode_lens.append(int(episode["length"]))
                if episode.get("outcome") is not None:  # validated at the coordinator: -1, 0 or 1
                    self.episode_outcomes.append(int(episode["outcome"]))
                    self.outcome_counts[int(episode["outcome"])] += 1
            if samples is None or not self._fits(samples, task_id):
                continue
            if not (self._trained if self.on_policy else self._stored)(samples, task_id):
                continue
            count += 1
            self.counters["results"] += 1
            if not self.on_policy and self.loop.env_step >= self.learning_starts:
                self.credit += self._credited_steps(env_steps) * self.ratio
        return count

    def _credited_steps(self, env_steps: int) -> int:
        """The env steps of a result (just counted into ``env_step``, which reached ``learning_starts``) that earn
        gradient steps: serial mode trains ``update_per_collect`` after each collection of ``collect.n`` env steps
        that ends at or past ``learning_starts``, so the steps from the first such collection's start on count (a
        result of one collection: all of it; a large one crossing ``learning_starts``: the part past it, plus one
        collection)."""
        return min(env_steps, self.loop.env_step - self.learning_starts + self.collect_n)

    def _read(self, result: Mapping[str, Any], task_id: str) -> Optional[List[Dict[str, Any]]]:
        lag = self.loop.train_iter - int(result.get("policy_iter", 0))
        if self.max_policy_lag is not None and lag > int(self.max_policy_lag):
            self.counters["dropped_stale"] += 1
            self.logger.info(
                "dropped the data of %s: its policy is %d gradient steps old (max %d)",
                task_id,
                lag,
                self.max_policy_lag,
            )
            return None
        try:
            samples, _ = decode_samples(self.storage.get(result["data"]))
        except ProtocolError as error:
            self.counters["missing" if error.status == 404 else "bad_data"] += 1
            self.logger.warning("skipped the data of %s: %s", task_id, error)
            return None
        return samples

    def _fits(self, samples: List[Dict[str, Any]], task_id: str) -> bool:
        """Whether the samples fit the env's spaces (else counted in ``bad_data`` and logged with the field)."""
        problem = None if self.check is None else self.check.problem(samples)
        if problem is not None:
            self._skipped(task_id, problem)
            return False
        return True

    def _stored(self, samples: List[Dict[str, Any]], task_id: str) -> bool:
        """Add ``samples`` to the replay buffer; False (counted, logged) when their fields or shapes are not the
        buffer's: a well-formed file of other samples (forged, or from another config) must not stop the learner."""
        try:
            self.loop.store(samples)  # stores all or nothing
        except ValueError as error:
            self._skipped(task_id, str(error))
            return False
        return True

    def _trained(self, samples: List[Dict[str, Any]], task_id: str) -> bool:
        """(On-policy) Train on a rollout (every rank on its shard); False (counted, logged) for one whose fields,
        shapes or dtypes differ between its samples or from the rollouts trained on before, or, before any rollout
        was, one the policy cannot train on (a single learner: the error of its first minibatch, before any optimizer
        step). Every rank checks the whole rollout, so all ranks decide alike."""
        layout = sample_layout(samples[0])
        problem = self._layout_problem(samples, layout)
        if problem is None:
            try:
                self.loop.train_rollout(samples)
            except (KeyError, IndexError, TypeError, ValueError, RuntimeError) as error:
                if self._rollout_layout is not None or self.loop.world_size > 1:
                    raise  # a layout that trained before, or ranks that must fail together: a real error
                problem = f"the policy cannot train on it: {type(error).__name__}: {error}"
            else:
                self._rollout_layout = layout
                if self.on_trained is not None:
                    self.on_trained()
                return True
        self._skipped(task_id, problem)
        return False

    def _layout_problem(self, samples: List[Dict[str, Any]], layout: Layout) -> Optional[str]:
        """What differs between the samples of a rollout, or from the rollouts trained on before (None: nothing)."""
        odd = next((i for i, sample in enumerate(samples) if sample_layout(sample) != layout), None)
        if odd is not None:
            return f"sample {odd}'s fields, shapes or dtypes differ from sample 0's"
        if self._rollout_layout is not None and layout != self._rollout_layout:
            theirs, ours = dict(layout), dict(self._rollout_layout)
            field = sorted(k for k in set(theirs) | set(ours) if theirs.get(k) != ours.get(k))[0]
            theirs_kind, ours_kind = theirs.get(field, "missing"), ours.get(field, "none")
            return f"field {field!r} is {theirs_kind}, the rollouts trained on have {ours_kind}"
        return None

    def _skipped(self, task_id: str, problem: str) -> None:
        self.counters["bad_data"] += 1
        self.logger.warning("skipped the data of %s: %s", task_id, problem)


__all__ = [
    "DataIntake",
    "SampleCheck",
    "sample_layout",
    "TRAIN_CHUNK",
    "EPISODE_WINDOW",
    "MAX_SAMPLE_MAGNITUDE",
]
