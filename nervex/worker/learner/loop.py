"""The learn loop: what training does with collected samples, written once for the serial and the parallel mode.

``SerialTrainer`` and the parallel ``LearnerRole`` each hold one ``LearnLoop`` and keep only their wiring (collect
and step for one; poll, ingest, publish, report and checkpoint for the other). Per batch of new data they call::

    loop.env_step += env_steps                         # the env steps the data took
    on-policy:  loop.train_rollout(samples)            # epoch_per_collect shuffled passes of minibatches
    off-policy: loop.store(samples); loop.train_off_policy(steps)   # sample, train, update priorities
    if loop.eval_due(): loop.evaluate()                # eval.csv, eval/* scalars, ckpt/best.pt, stop at stop_val
    loop.check_limits()                                # stop at max_env_step / max_train_iter
    loop.write_scalars(figures)                        # train/*, time/*, the buffer's, the caller's figures

How many off-policy steps are owed is the caller's: ``update_per_collect`` per collection after ``learning_starts``
in serial mode, the replay-ratio credit of the data received in parallel mode.
"""

from __future__ import annotations

import csv
import logging
import os
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Mapping, NamedTuple, Optional

import torch

from nervex.torch_utils import collate
from nervex.utils.log_helper import CsvWriter, ScalarWriter

from .base_learner import BaseLearner

if TYPE_CHECKING:
    from nervex.data import AsyncDataLoader, BaseBuffer
    from nervex.policy import Policy
    from nervex.worker.actor import SerialEvaluator

EVAL_CSV_FIELDS = [
    "env_step",
    "train_iter",
    "mean_reward",
    "std_reward",
    "min_reward",
    "max_reward",
    "n_episode",
    "wall_time",
    "eval_time",
]
"""The columns of a run's ``eval.csv``, one row per evaluation; a run of many agents or of an env that reports
episode stats adds the evaluator's ``figure_names`` after them (``team_return_sum``, ``team_return_mean``,
``return/<agent_id>``, ``<stat>``), fixed at its first evaluation."""
SCALAR_INTERVAL = 1000
"""Env steps between two writes of the train/time/rollout scalars (keeps event files small); an evaluation or a stop
writes them at once."""


def read_csv_header(path: str) -> List[str]:
    """The column names of an existing CSV file (empty when it is missing or empty)."""
    if not os.path.exists(path) or os.path.getsize(path) == 0:
        return []
    with open(path, newline="", encoding="utf-8") as f:
        return next(csv.reader(f), [])


def index_batch(batch: Any, index: torch.Tensor) -> Any:
    """Rows ``index`` of every tensor in a (nested) batch dict; other values pass through.

    Shapes:
        every tensor: ``(N, ...)`` -> ``(len(index), ...)``.
    """
    if isinstance(batch, torch.Tensor):
        return batch.index_select(0, index.to(batch.device))
    if isinstance(batch, Mapping):
        return {k: index_batch(v, index) for k, v in batch.items()}
    return batch


def train_scalar_name(key: str) -> str:
    """The scalar name of a learn figure: ``total_loss`` is SB3's ``train/loss``, any other ``k`` is ``train/k``."""
    return "train/loss" if key == "total_loss" else f"train/{key}"


class FigureMeans:
    """Running means of a learner's scalar figures: numbers and 0-d tensors count, bools and other values do not."""

    def __init__(self) -> None:
        self.sums: Dict[str, float] = {}
        self.steps = 0

    def add(self, info: Mapping[str, Any]) -> None:
        """Count one gradient step's figures."""
        for key, value in info.items():
            if isinstance(value, torch.Tensor) and value.dim() == 0:
                value = float(value)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                self.sums[key] = self.sums.get(key, 0.0) + float(value)
        self.steps += 1

    def means(self) -> Dict[str, float]:
        """Each figure's mean over the steps counted (empty when none were)."""
        return {k: v / self.steps for k, v in self.sums.items()} if self.steps else {}

    def take(self) -> Dict[str, float]:
        """``means()``, then start counting afresh."""
        means = self.means()
        self.sums, self.steps = {}, 0
        return means


class Trained(NamedTuple):
    """What one learn phase did: its gradient steps and their figures' means (the learn mode's names)."""

    steps: int
    figures: Dict[str, float]


class LearnLoop:
    """The learn phase of a run: trains a policy's learn mode on collected data, evaluates it, and stops the run.

    Args:
        cfg: The run's compiled config (read: ``max_env_step``, ``max_train_iter``, ``evaluator.stop_val``).
        policy: The policy (its learn and command modes are used; ``type(policy).contract`` says how to train).
        learner: The ``BaseLearner`` over the policy's learn mode.
        buffer: The replay buffer (None on-policy).
        evaluator: The ``SerialEvaluator`` over the policy's eval mode.
        run_dir: Where ``eval.csv`` and ``ckpt/best.pt`` go; None writes neither (a learner rank other than 0).
        logger: Where evaluations and the stop go.
        scalar_writer: TensorBoard scalars (default: none written).
        seed: Seeds the order of on-policy minibatches.
        rank: This learner's rank in a data-parallel group: it trains on its shard of each rollout.
        world_size: The group's size (1: alone); each rank's minibatch is ``batch_size // world_size``.
        prefetch: Off-policy batches an ``AsyncDataLoader`` samples ahead in a thread (0: sample in this thread).
        on_batch: Called with ``(batch, figures)`` after each gradient step (the serial trainer's callbacks).

    Example:
        >>> loop = LearnLoop(cfg, policy, learner, buffer, evaluator, run_dir='runs/x')
        >>> loop.env_step += len(samples)
        >>> loop.store(samples)
        >>> loop.train_off_policy(steps=4).figures['total_loss']
    """

    def __init__(
        self,
        cfg: Mapping[str, Any],
        policy: Policy,
        learner: BaseLearner,
        buffer: Optional[BaseBuffer],
        evaluator: SerialEvaluator,
        *,
        run_dir: Optional[str] = None,
        logger: Optional[logging.Logger] = None,
        scalar_writer: Optional[ScalarWriter] = None,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        prefetch: int = 0,
        on_batch: Optional[Callable[[Dict[str, Any], Dict[str, Any]], None]] = None,
    ) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"LearnLoop: rank must be in [0, world_size={world_size}), got {rank}")
        self.max_env_step = int(cfg["max_env_step"])
        self.max_train_iter = int(cfg["max_train_iter"])
        self.stop_val = cfg["evaluator"]["stop_val"]
        self.policy, self.learner, self.buffer, self.evaluator = policy, learner, buffer, evaluator
        self.contract = type(policy).contract(policy.cfg)
        self.run_dir = run_dir
        self.logger = logger or logging.getLogger(__name__)
        self.scalar_writer = scalar_writer or ScalarWriter(None)
        self.rank, self.world_size = int(rank), int(world_size)
        self.prefetch = int(prefetch)
        self.on_batch = on_batch
        self.eval_csv: Optional[CsvWriter] = None  # opened at the first evaluation, which fixes its columns
        self.loader: Optional[AsyncDataLoader] = None  # the AsyncDataLoader when prefetching, made at the first batch
        self._shuffle = torch.Generator().manual_seed(int(seed))
        self._window = FigureMeans()  # the train figures since the last scalar write
        self.env_step = 0
        self.stopped = False
        self.stop_reason = ""
        self.last_eval: Dict[str, Any] = {}
        self._start_time = time.time()
        self._start_env_step = 0
        self._last_scalar_step = 0
        self._scalars_due = False

    # ---- progress ------------------------------------------------------------------------------------------------
    @property
    def train_iter(self) -> int:
        """Gradient steps taken so far."""
        return int(self.learner.last_iter)

    def command_info(self) -> Dict[str, Any]:
        """The progress the command mode turns into settings (``learner_step`` is nerveX's name of ``train_iter``)."""
        return {
            "env_step": self.env_step,
            "train_iter": self.train_iter,
            "learner_step": self.train_iter,
            "max_env_step": self.max_env_step,
            "max_train_iter": self.max_train_iter,
        }

    def set_progress(self, env_step: int) -> None:
        """Continue from ``env_step`` (a resumed run): frames per second count from here."""
        self.env_step = self._start_env_step = self._last_scalar_step = int(env_step)

    # ---- training ------------------------------------------------------------------------------------------------
    def train_rollout(self, samples: List[Dict[str, Any]]) -> Trained:
        """``epoch_per_collect`` shuffled passes of minibatches over a rollout (this rank's shard of it).

        With ``world_size`` ranks, the rollout is cut to a multiple of ``world_size`` and each rank takes every
        ``world_size``-th sample from its rank on, with minibatches of ``batch_size // world_size``: every rank takes
        the same number of steps (their gradient all-reduces pair up).

        Returns:
            The steps taken: ``epoch_per_collect * ceil(n / batch_size)`` for ``n`` samples on one rank.
        """
        if self.world_size > 1:
            samples = samples[: len(samples) - len(samples) % self.world_size][self.rank :: self.world_size]
        if not samples:
            return Trained(0, {})
        batch = collate(samples)
        n = len(samples)
        size = max(1, (self.contract.learn.batch_size or n * self.world_size) // self.world_size)
        setting = self.policy.command_mode.get_setting_learn(self.command_info())
        phase = FigureMeans()
        for _ in range(self.contract.learn.epoch_per_collect):
            # one minibatch of the whole rollout: its gradient is a mean over all samples, so order is irrelevant
            order = torch.randperm(n, generator=self._shuffle) if size < n else None
            for start in range(0, n, size):
                minibatch = batch if order is None else index_batch(batch, order[start : start + size])
                self._train_step(minibatch, setting, phase)
        return Trained(phase.steps, phase.means())

    def store(self, samples: List[Dict[str, Any]]) -> None:
        """Add samples to the replay buffer (all or nothing: a ``ValueError`` names a field it cannot hold)."""
        if self.buffer is None:
            raise RuntimeError("LearnLoop.store: this run is on-policy and has no replay buffer; use train_rollout")
        self.buffer.extend(samples, learner_iter=self.train_iter)

    def train_off_policy(self, steps: int) -> Trained:
        """Up to ``steps`` gradient steps on batches sampled from the replay buffer, updating their priorities.

        Fewer are taken when the buffer holds less than a batch, or cannot give one (its samples-per-insert limit).
        With ``world_size`` ranks each samples ``batch_size // world_size`` from its own buffer: one gradient step
        (gradients averaged across ranks) consumes ``batch_size`` samples, as in serial mode, so the serial replay
        ratio and the coordinator's rate limiter count the same thing.
        """
        batch_size = max(1, int(self.contract.learn.batch_size) // self.world_size)
        if self.buffer is None or steps <= 0 or len(self.buffer) < batch_size:
            return Trained(0, {})
        setting = self.policy.command_mode.get_setting_learn(self.command_info())
        phase = FigureMeans()
        for _ in range(int(steps)):
            batch = self._next_batch(batch_size)
            if batch is None:
                break
            info = self._train_step(batch, setting, phase)
            if "priority" in info:
                self.buffer.update(info["priority"], unique_id=batch["unique_id"])
        return Trained(phase.steps, phase.means())

    def _train_step(self, batch: Dict[str, Any], setting: Dict[str, Any], phase: FigureMeans) -> Dict[str, Any]:
        info = self.learner.train(batch, self.env_step, setting)
        if self.on_batch is not None:
            self.on_batch(batch, info)
        phase.add(info)
        self._window.add(info)
        return info

    def _next_batch(self, batch_size: int) -> Optional[Dict[str, Any]]:
        if self.prefetch <= 0:
            return self.buffer.sample(batch_size, learner_iter=self.train_iter)
        if self.loader is None:
            from nervex.data import AsyncDataLoader

            self.loader = AsyncDataLoader(
                self.buffer,
                batch_size=batch_size,
                queue_size=self.prefetch,
                pin_memory=self.policy.device.type == "cuda",
                learner_iter_fn=lambda: self.train_iter,
            )
        return next(self.loader)

    # ---- evaluation and limits -----------------------------------------------------------------------------------
    def eval_due(self) -> bool:
        """Whether ``evaluator.eval_freq`` env steps passed since the last evaluation."""
        return self.evaluator.should_eval(self.env_step)

    def evaluate(self) -> Dict[str, Any]:
        """Evaluate now: a row of ``eval.csv``, the ``eval/*`` scalars, ``ckpt/best.pt`` when the mean beats every
        earlier one, and a stop once it reaches ``stop_val``. Returns the ``eval/*`` figures."""
        setting = self.policy.command_mode.get_setting_eval(self.command_info())
        res = self.evaluator.eval(self.train_iter, self.env_step, setting)
        self.last_eval = res
        figures = {k: v for k, v in res.items() if k.startswith("eval/")}
        csv_file = self._open_eval_csv()
        if csv_file is not None:
            wall = time.time() - self._start_time
            csv_file.write(
                {k.removeprefix("eval/"): v for k, v in res.items()}
                | {"wall_time": wall, "eval_time": res["eval/time"]}
            )
        self.scalar_writer.add_scalars(figures, self.env_step)
        self._scalars_due = True
        self.logger.info(
            f"[evaluator] env_step={self.env_step} train_iter={self.train_iter} mean_reward="
            f"{res['eval/mean_reward']:.2f} (+-{res['eval/std_reward']:.2f}, {res['eval/n_episode']} episodes)"
        )
        if res["best"] and self.run_dir:
            self.learner.env_step = self.env_step
            self.learner.save_checkpoint(os.path.join(self.run_dir, "ckpt", "best.pt"))
        if res["stop"] and not self.stopped:
            self.stop(f"evaluation mean {res['eval/mean_reward']:.2f} >= stop_val {self.stop_val}")
            self.logger.info(f"target reached: {self.stop_reason}")
        return figures

    def _open_eval_csv(self) -> Optional[CsvWriter]:
        """``eval.csv`` (None without a run directory): ``EVAL_CSV_FIELDS`` plus the evaluator's ``figure_names``
        known at the first evaluation (a stat an env reports only later is in TensorBoard, not in the file); a
        resumed run's file keeps its header."""
        if self.eval_csv is None and self.run_dir:
            path = os.path.join(self.run_dir, "eval.csv")
            fields = read_csv_header(path) or EVAL_CSV_FIELDS + list(self.evaluator.figure_names)
            self.eval_csv = CsvWriter(path, fields)
        return self.eval_csv

    def check_limits(self) -> bool:
        """Stop once ``max_env_step`` or ``max_train_iter`` is reached; returns whether the run is stopped."""
        if not self.stopped:
            if self.env_step >= self.max_env_step:
                self.stop(f"max_env_step {self.max_env_step} reached")
            elif self.train_iter >= self.max_train_iter:
                self.stop(f"max_train_iter {self.max_train_iter} reached")
        return self.stopped

    def stop(self, reason: str) -> None:
        """Mark the run stopped (the first reason given is kept)."""
        if not self.stopped:
            self.stopped, self.stop_reason = True, reason
            self._scalars_due = True

    # ---- figures -------------------------------------------------------------------------------------------------
    def time_figures(self) -> Dict[str, float]:
        """``time/fps`` (env steps per second since the start or resume) and ``time/time_elapsed`` (seconds)."""
        elapsed = max(1e-9, time.time() - self._start_time)
        return {"time/fps": (self.env_step - self._start_env_step) / elapsed, "time/time_elapsed": elapsed}

    def write_scalars(self, figures: Optional[Mapping[str, Any]] = None, force: bool = False) -> bool:
        """Write the scalars when due (every ``SCALAR_INTERVAL`` env steps, after an evaluation or a stop, or when
        ``force``): ``time/*``, ``train/train_iter``, each ``train/<k>`` averaged over the steps since the last
        write, the buffer's ``stats()`` and the caller's ``figures`` with a slash in their name. Returns whether it
        wrote."""
        due = self._scalars_due or self.env_step - self._last_scalar_step >= SCALAR_INTERVAL
        if not (force or due):
            return False
        self._last_scalar_step, self._scalars_due = self.env_step, False
        scalars: Dict[str, float] = {**self.time_figures(), "train/train_iter": float(self.train_iter)}
        scalars.update({train_scalar_name(k): v for k, v in self._window.take().items()})
        scalars.update({k: v for k, v in (figures or {}).items() if "/" in k and v is not None})
        if self.buffer is not None:
            scalars.update(self.buffer.stats())
        self.scalar_writer.add_scalars(scalars, self.env_step)
        return True

    # ---- checkpoints and the end ---------------------------------------------------------------------------------
    def state_dict(self) -> Dict[str, Any]:
        """The learner's checkpoint state (policy, optimizers, ``train_iter``) with this loop's ``env_step``."""
        self.learner.env_step = self.env_step
        return self.learner.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a checkpoint's state; training goes on from its ``train_iter`` and ``env_step``."""
        self.learner.load_state_dict(dict(state))
        self.set_progress(self.learner.env_step)

    def finish(self) -> None:
        """Run the learner's ``after_run`` hooks (``ckpt/final.pt``) with this loop's ``env_step``."""
        self.learner.env_step = self.env_step
        self.learner.call_hook("after_run")

    def close(self) -> None:
        """Stop the prefetching thread and close ``eval.csv`` (written with its header even when no evaluation ran);
        safe to call twice."""
        if self.loader is not None:
            self.loader.close()
        csv_file = self._open_eval_csv()
        if csv_file is not None:
            csv_file.close()


__all__ = [
    "LearnLoop",
    "Trained",
    "FigureMeans",
    "EVAL_CSV_FIELDS",
    "SCALAR_INTERVAL",
    "index_batch",
    "train_scalar_name",
]
