"""The learner role: train on the trajectories the coordinator announces, publish snapshots, evaluate, checkpoint.

The loop (``LearnerRole.step``), with the same policy, buffer, learner and evaluator code as serial mode:

1. ``/v1/data/poll`` returns the accepted collect results after the learner's cursor (``since_seq``). Each names a
   samples file on the storage path; it is read (SHA-256 checked), decoded (``decode_samples``: safetensors, never
   pickle), and then deleted. Data whose snapshot is more than ``system.learner.max_policy_lag`` gradient steps old is
   dropped and counted.
2. Off-policy: the samples go to the replay buffer, and every env step earns ``update_per_collect / n_sample``
   gradient steps (the serial trainer's replay ratio, whatever size the collect tasks have). On-policy: each rollout
   is trained on as it arrives (``epoch_per_collect`` passes of minibatches), then a snapshot is published.
3. Every ``snapshot_every`` gradient steps (not more often than ``snapshot_min_interval_s``) the weights
   (``{'model', 'extra'}``, no optimizer) go to the storage path and ``/v1/learner/progress`` announces them with the
   progress the coordinator's rate limiter reads (``sampled``: batches x batch size).
4. The evaluator runs as in serial mode (``eval.csv``, TensorBoard, ``ckpt/best.pt``); reaching ``stop_val``,
   ``max_env_step`` or ``max_train_iter`` sends ``/v1/run/finish``, which stops every role.
5. ``ckpt/iteration_<n>.pt`` is written atomically every ``checkpoint_interval_min`` minutes, on SIGUSR1, and on
   SIGTERM (then the learner stops); a restarted learner loads the newest valid one, with its poll cursor.

With several ranks (``torch.distributed``, see ``nervex.system.distributed``), rank 0 alone talks HTTP: each loop it
broadcasts what it polled (as JSON bytes) and whether to stop; every rank reads the same files into its own replay
buffer (sampled with its own seed) or its shard of each rollout, and gradients are averaged across ranks.
"""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from typing import Any, Deque, Dict, List, Mapping, Optional, Tuple

import numpy as np
import torch

from nervex.policy import set_seed
from nervex.system.comm.codec import encode_state_dict, flatten_arrays
from nervex.system.comm.errors import ProtocolError
from nervex.system.comm.storage import Storage
from nervex.system.protocol import (
    DATA_POLL_PATH,
    LEARNER_PROGRESS_PATH,
    RUN_FINISH_PATH,
    compile_parallel_config,
    storage_root,
)
from nervex.system.role import RoleLink as WorkerLink  # renamed in issue 28 (helper "system")
from nervex.system.samples import decode_samples
from nervex.torch_utils import collate
from nervex.utils.log_helper import CsvWriter, ScalarWriter

PROGRESS_INTERVAL_S = 0.05
"""Progress (the rate limiter's input) is reported at most this often, and whenever a snapshot is published."""
TRAIN_CHUNK = 64
"""Gradient steps between two polls when much training is owed (keeps snapshots and progress flowing)."""
EVAL_DEFER_CREDIT = 4 * TRAIN_CHUNK
"""An evaluation that falls due waits for the gradient steps owed for the data so far (as serial mode evaluates after
training on what it collected), unless more than this many are owed (actors far ahead, no rate limiter)."""


def sample_layout(sample: Mapping[str, Any]) -> Tuple[Tuple[str, str], ...]:
    """``(leaf, 'shape dtype')`` for each leaf of a sample, sorted: what every sample of a rollout must share."""
    layout = []
    for name, value in flatten_arrays(sample).items():
        if isinstance(value, (torch.Tensor, np.ndarray, np.generic)):
            layout.append((name, f"{tuple(value.shape)} {value.dtype}"))
        else:
            layout.append((name, type(value).__name__))
    return tuple(sorted(layout))


class LearnerRole:
    """One learner process (one rank of a data-parallel learner).

    Args:
        cfg: The run's config (compiled with ``compile_parallel_config`` if needed).
        run_dir: The run directory (the serial run's layout: ``config.yaml``, ``eval.csv``, TensorBoard, ``ckpt/``).
        worker_id: Its id at the coordinator.
        url: The coordinator's (or relaying manager's) address; None: ``<run_dir>/coordinator.url``.
        logger: Where events go.
        token: The run's secret (tests); read from the run directory if None.
        dist: This process's place in a data-parallel group (``nervex.system.distributed.DistInfo``); None: alone.
    """

    def __init__(
        self,
        cfg: Mapping[str, Any],
        run_dir: str,
        worker_id: str,
        url: Optional[str] = None,
        logger: Optional[logging.Logger] = None,
        token: Optional[bytes] = None,
        dist: Optional[Any] = None,
    ) -> None:
        from nervex.config import save_config
        from nervex.entry.builder import make_buffer, make_env_managers, make_evaluator, make_learner, make_policy
        from nervex.entry.serial_entry import EVAL_CSV_FIELDS
        from nervex.system.checkpoints import CheckpointKeeper

        self.cfg = compile_parallel_config(cfg)
        self.run_dir = run_dir
        self.logger = logger or logging.getLogger(__name__)
        self.settings = self.cfg.system.learner
        self.dist = dist
        self.rank = 0 if dist is None else int(dist.rank)
        self.world_size = 1 if dist is None else int(dist.world_size)
        self.is_main = self.rank == 0
        self.seed = int(self.cfg.seed) + self.rank
        set_seed(self.seed)
        if self.cfg.num_threads:
            torch.set_num_threads(int(self.cfg.num_threads))
        self.storage = Storage(storage_root(self.cfg, run_dir), min_free_bytes=0)
        self.link = (
            WorkerLink(self.cfg, run_dir, "learner", worker_id, url=url, token=token, logger=self.logger)
            if (self.is_main)
            else None
        )
        os.makedirs(os.path.join(run_dir, "ckpt"), exist_ok=True)
        self.scalar_writer = ScalarWriter(run_dir if self.is_main else None)
        self._env_managers: List[Any] = []
        try:
            _, evaluator_env, env_info = make_env_managers(self.cfg, int(self.cfg.seed), collector=False)
            self._env_managers.append(evaluator_env)
            self.policy = make_policy(self.cfg, env_info, enable_field=["learn", "eval", "command"])
            self.contract = type(self.policy).contract(self.policy.cfg)
            self.learner = make_learner(self.cfg, self.policy, run_dir if self.is_main else None, self.logger, None)
            self.evaluator = make_evaluator(self.cfg, evaluator_env, self.policy)
            self.evaluator.logger = self.logger
            self.buffer = make_buffer(self.cfg, self.contract, self.seed)
        except BaseException:
            for manager in self._env_managers:
                manager.close()
            raise
        self._grad_hooks: Any = None
        # rank 0 alone keeps checkpoints (a keeper clears the directory's temporary files when it starts)
        self.keeper = (
            CheckpointKeeper(
                os.path.join(run_dir, "ckpt"),
                keep=int(self.settings.keep_checkpoints),
                interval_s=60.0 * float(self.settings.checkpoint_interval_min),
                logger=self.logger,
            )
            if self.is_main
            else None
        )
        self.eval_csv = CsvWriter(os.path.join(run_dir, "eval.csv"), EVAL_CSV_FIELDS) if self.is_main else None
        if self.is_main:
            save_config(self.cfg, os.path.join(run_dir, "config.yaml"))
        self._shuffle = torch.Generator().manual_seed(self.seed)
        learn = self.contract.learn
        self._ratio = float(learn.update_per_collect) / max(1, int(self.contract.collect.n))
        self._credit = 0.0
        self._rollout_layout: Optional[Tuple[Tuple[str, str], ...]] = None  # (on-policy) what was trained on
        self.env_step = 0
        self.seq = 0
        self.counters: Dict[str, int] = {"results": 0, "dropped_stale": 0, "missing": 0, "bad_data": 0}
        self.episode_returns: Deque[float] = deque(maxlen=100)
        self.episode_lens: Deque[int] = deque(maxlen=100)
        self.snapshot: Optional[str] = None
        self._published: Deque[str] = deque()
        self._published_iter = -1
        self._published_at = 0.0
        self._reported_at = 0.0
        self._reported: Tuple[int, int] = (-1, -1)  # (train_iter, env_step) of the last progress report
        self._train_sums: Dict[str, float] = {}
        self._train_steps = 0
        self._last_log_step = 0
        self.stopped = False
        self._stop_seen = False
        self.checkpoint_failures = 0
        self.stop_reason = ""
        self.last_eval: Dict[str, Any] = {}
        self._start_time = time.time()
        self._start_env_step = 0
        if int(self.cfg.learner.prefetch) > 0:
            self.logger.warning("learner.prefetch is not used by the parallel learner (it samples in its own loop)")
        self.learner.call_hook("before_run")  # learner.hook.load_ckpt: initial weights for a new run
        self.env_step = int(self.learner.env_step)
        resumed = self._resume() if self.is_main else None  # a restarted learner: its own newest checkpoint wins
        if dist is not None and self.world_size > 1:
            self._join_group(resumed)

    # ---- set-up ----------------------------------------------------------------------------------------------
    def _join_group(self, resumed: Optional[str]) -> None:
        """Join the data-parallel group and start from rank 0's state: the checkpoint it resumed from (every rank
        loads the same file, so optimizer states have one layout), then its whole policy state and counters."""
        from nervex.system import distributed
        from nervex.torch_utils import load_checkpoint

        timeout_s = float(self.settings.dist_timeout_s)
        distributed.init_process_group(self.dist, device=str(self.policy.device), timeout_s=timeout_s)
        path = distributed.broadcast_json({"resumed": resumed})["resumed"]
        if path and not self.is_main:
            self._apply_checkpoint(load_checkpoint(path))
        distributed.broadcast_policy(self.policy, src=0)
        counters = distributed.broadcast_json({"seq": self.seq, "env_step": self.env_step, "credit": self._credit})
        self.seq, self.env_step, self._credit = int(counters["seq"]), int(counters["env_step"]), counters["credit"]
        self._grad_hooks = distributed.attach_gradient_allreduce(
            [self.policy._model], self.world_size, distributed.optimized_tensors(self.policy)
        )

    def _resume(self) -> Optional[str]:
        """Load the newest valid checkpoint (rank 0); returns its path, None for a fresh start."""
        assert self.keeper is not None
        loaded = self.keeper.load_latest()
        if loaded is None:
            return None
        path, state = loaded
        self._apply_checkpoint(state)
        self.logger.info(
            "resumed from %s: train_iter=%d env_step=%d poll cursor=%d", path, self.train_iter, self.env_step, self.seq
        )
        return path

    def _apply_checkpoint(self, state: Mapping[str, Any]) -> None:
        self.learner.load_state_dict(dict(state))
        system = state.get("system", {})
        self.env_step = int(self.learner.env_step)
        self.seq = int(system.get("seq", 0))
        self._credit = float(system.get("credit", 0.0))
        self._start_env_step = self.env_step
        self._last_log_step = self.env_step

    @property
    def train_iter(self) -> int:
        return int(self.learner.last_iter)

    def command_info(self) -> Dict[str, Any]:
        return {
            "env_step": self.env_step,
            "train_iter": self.train_iter,
            "learner_step": self.train_iter,
            "max_env_step": int(self.cfg.max_env_step),
            "max_train_iter": int(self.cfg.max_train_iter),
        }

    # ---- the loop ------------------------------------------------------------------------------------------------
    def run(self, signals: Optional[Any] = None) -> str:
        """Train until the target, a limit or the coordinator's stop; returns the reason.

        Args:
            signals: A ``nervex.system.checkpoints.StopSignals`` (or anything with ``checkpoint_requested()`` and
                ``stop_requested()``): SIGUSR1 writes a checkpoint, SIGTERM/SIGINT write one and stop.
        """
        if self.link is not None:
            if signals is not None:
                self.link.stop_requested = signals.stop_requested
            self.link.register()
            self.link.start_heartbeat()
        self._publish(force=True)
        try:
            # until a stop went through _control: with several ranks, every rank must see it before the group ends
            while not self._stop_seen:
                external_stop = bool(signals is not None and signals.stop_requested())
                if signals is not None and not external_stop and signals.checkpoint_requested():
                    self.save_checkpoint("SIGUSR1")
                if not self.step(external_stop):
                    time.sleep(float(self.settings.poll_wait_s))
        finally:
            self.close()
        return self.stop_reason

    def step(self, external_stop: bool = False) -> bool:
        """One pass: poll, ingest, train what is owed, publish, report, evaluate. Returns whether anything happened."""
        message = self._control(external_stop)
        if message["stop"]:
            self._stop(message.get("reason") or "stopped")
            self._stop_seen = True
            return True
        ingested = self._ingest(message["items"])
        trained = self._train_owed()
        if self.is_main:
            self._publish()
            self._report()
            self._maybe_eval()
            self._check_limits()
            if self.keeper is not None and self.keeper.due():
                self.save_checkpoint("periodic")
            self._log()
        return bool(ingested or trained)

    def _control(self, external_stop: bool) -> Dict[str, Any]:
        """What every rank does this pass: rank 0 polls; the others receive it."""
        message: Dict[str, Any] = {"items": [], "stop": False}
        if self.is_main:
            if external_stop:
                message = {"items": [], "stop": True, "reason": "stopped by a signal"}
            elif self.stopped or (self.link is not None and self.link.stopping.is_set()):
                message = {"items": [], "stop": True, "reason": self.stop_reason or "the coordinator said stop"}
            elif self._needs_data():
                answer = self.link.call_registered(  # type: ignore[union-attr]
                    DATA_POLL_PATH, {"since_seq": self.seq, "limit": int(self.settings.poll_limit)}
                )
                message["items"] = answer.get("items", [])
                if answer.get("stop") and not message["items"]:
                    message = {"items": [], "stop": True, "reason": "the coordinator said stop"}
        if self.world_size > 1:
            from nervex.system import distributed

            message = distributed.broadcast_json(message, src=0)
        return message

    def _needs_data(self) -> bool:
        if self.contract.on_policy:
            return True
        return self._credit < 1.0 or self.buffer is None or len(self.buffer) < self.contract.learn.batch_size

    # ---- data ------------------------------------------------------------------------------------------------
    def _ingest(self, items: List[Mapping[str, Any]]) -> int:
        count = 0
        for item in items:
            self.seq = max(self.seq, int(item["seq"]))
            result = item["result"]
            samples = self._read(result, item.get("task_id", "?"))
            if self.world_size > 1:
                from nervex.system import distributed

                distributed.barrier()  # every rank has read the file before rank 0 deletes it
            if self.is_main:
                self.storage.delete(result["data"])
            env_steps = int(result["env_steps"])
            self.env_step += env_steps
            for episode in result.get("episodes", []):
                self.episode_returns.append(float(episode["return"]))
                self.episode_lens.append(int(episode["length"]))
            if samples is None:
                continue
            task_id = item.get("task_id", "?")
            if not (self._trained(samples, task_id) if self.contract.on_policy else self._stored(samples, task_id)):
                continue
            count += 1
            self.counters["results"] += 1
            if not self.contract.on_policy:
                starts = int(self.contract.learn.learning_starts)
                counted = min(env_steps, max(0, self.env_step - starts))
                self._credit += counted * self._ratio
        return count

    def _stored(self, samples: List[Dict[str, Any]], task_id: str) -> bool:
        """Add ``samples`` to the replay buffer; False (counted, logged) when their fields or shapes are not the
        buffer's: a well-formed file of other samples (forged, or from another config) must not stop the learner."""
        try:
            self.buffer.extend(samples, learner_iter=self.train_iter)  # stores all or nothing
        except ValueError as error:
            self.counters["bad_data"] += 1
            self.logger.warning("skipped the data of %s: %s", task_id, error)
            return False
        return True

    def _trained(self, samples: List[Dict[str, Any]], task_id: str) -> bool:
        """(On-policy) Train on a rollout; False (counted, logged) for one whose fields, shapes or dtypes differ
        between its samples or from the rollouts trained on before, or, before any rollout was, one the policy cannot
        train on (a single learner: the error of its first minibatch, before any optimizer step). Like ``_stored``:
        a well-formed file of other samples must not stop the learner."""
        layout = sample_layout(samples[0])
        odd = next((i for i, sample in enumerate(samples) if sample_layout(sample) != layout), None)
        problem = None
        if odd is not None:
            problem = f"sample {odd}'s fields, shapes or dtypes differ from sample 0's"
        elif self._rollout_layout is not None and layout != self._rollout_layout:
            theirs, ours = dict(layout), dict(self._rollout_layout)
            field = sorted(k for k in set(theirs) | set(ours) if theirs.get(k) != ours.get(k))[0]
            problem = (
                f"field {field!r} is {theirs.get(field, 'missing')}, "
                f"the rollouts trained on have {ours.get(field, 'none')}"
            )
        else:
            try:
                self._train_rollout(samples)
            except (KeyError, IndexError, TypeError, ValueError, RuntimeError) as error:
                if self._rollout_layout is not None or self.world_size > 1:
                    raise  # a layout that trained before, or ranks that must fail together: a real error
                problem = f"the policy cannot train on it: {type(error).__name__}: {error}"
            else:
                self._rollout_layout = layout
                return True
        self.counters["bad_data"] += 1
        self.logger.warning("skipped the data of %s: %s", task_id, problem)
        return False

    def _read(self, result: Mapping[str, Any], task_id: str) -> Optional[List[Dict[str, Any]]]:
        lag_cap = self.settings.max_policy_lag
        lag = self.train_iter - int(result.get("policy_iter", 0))
        if lag_cap is not None and lag > int(lag_cap):
            self.counters["dropped_stale"] += 1
            self.logger.info(
                "dropped the data of %s: its policy is %d gradient steps old (max %d)", task_id, lag, lag_cap
            )
            return None
        try:
            samples, _ = decode_samples(self.storage.get(result["data"]))
        except ProtocolError as error:
            key = "missing" if error.status == 404 else "bad_data"
            self.counters[key] += 1
            self.logger.warning("skipped the data of %s: %s", task_id, error)
            return None
        if self.world_size > 1 and self.contract.on_policy:
            # equal shards: every rank must take the same number of minibatch steps (collectives pair up)
            usable = len(samples) - len(samples) % self.world_size
            samples = samples[:usable][self.rank :: self.world_size]
        return samples

    # ---- training --------------------------------------------------------------------------------------------
    def _train_owed(self) -> int:
        if self.contract.on_policy or self.buffer is None:
            return 0
        learn = self.contract.learn
        steps = 0
        setting = self.policy.command_mode.get_setting_learn(self.command_info())
        while self._credit >= 1.0 and len(self.buffer) >= learn.batch_size and steps < TRAIN_CHUNK:
            batch = self.buffer.sample(learn.batch_size, learner_iter=self.train_iter)
            info = self.learner.train(batch, self.env_step, setting)
            if "priority" in info:
                self.buffer.update(info["priority"], unique_id=batch["unique_id"])
            self._accumulate(info)
            self._credit -= 1.0
            steps += 1
        return steps

    def _train_rollout(self, samples: List[Dict[str, Any]]) -> None:
        from nervex.entry.serial_entry import index_batch

        batch = collate(samples)
        n = len(samples)
        size = max(1, (self.contract.learn.batch_size or n) // self.world_size)
        setting = self.policy.command_mode.get_setting_learn(self.command_info())
        for _ in range(self.contract.learn.epoch_per_collect):
            order = torch.randperm(n, generator=self._shuffle) if size < n else None
            for start in range(0, n, size):
                minibatch = batch if order is None else index_batch(batch, order[start : start + size])
                self._accumulate(self.learner.train(minibatch, self.env_step, setting))
        if self.is_main:
            self._publish(force=True)

    def _accumulate(self, info: Mapping[str, Any]) -> None:
        for key, value in info.items():
            if isinstance(value, torch.Tensor) and value.dim() == 0:
                value = float(value)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                self._train_sums[key] = self._train_sums.get(key, 0.0) + float(value)
        self._train_steps += 1

    # ---- snapshots and progress ------------------------------------------------------------------------------
    def snapshot_state(self) -> Dict[str, Any]:
        """The weights actors need: the policy's ``model`` and ``extra`` state, no optimizer."""
        state = self.policy.state_dict()
        return {"model": state["model"], "extra": state.get("extra", {})}

    def _publish(self, force: bool = False) -> Optional[str]:
        if not self.is_main:
            return None
        now = time.monotonic()
        due = self.train_iter - self._published_iter >= int(
            self.settings.snapshot_every
        ) and now - self._published_at >= float(self.settings.snapshot_min_interval_s)
        if not (force or due) or self.train_iter == self._published_iter:
            return None
        name = self.storage.put(encode_state_dict(self.snapshot_state()), "snapshot")
        self.snapshot, self._published_iter, self._published_at = name, self.train_iter, now
        if not self._published or self._published[-1] != name:
            self._published.append(name)
        while len(self._published) > int(self.settings.keep_snapshots):
            self.storage.delete(self._published.popleft())
        self._report(force=True)
        return name

    def _report(self, force: bool = False) -> None:
        if self.link is None:
            return
        now = time.monotonic()
        current = (self.train_iter, self.env_step)  # new data counts too: a refilling buffer is progress
        if not force and (current == self._reported or now - self._reported_at < PROGRESS_INTERVAL_S):
            return
        body = {
            "train_iter": self.train_iter,
            "env_step": self.env_step,
            "sampled": self.train_iter * int(self.contract.learn.batch_size or 1) * self.world_size,
            "snapshot": self.snapshot,
            "policy_iter": max(0, self._published_iter),
        }
        if self.buffer is not None:
            body["buffer_size"] = len(self.buffer)  # below learning_starts, the rate limiter lets it refill
        self.link.call_registered(LEARNER_PROGRESS_PATH, body)
        self._reported_at, self._reported = now, current

    # ---- evaluation, limits, logs ----------------------------------------------------------------------------
    def _maybe_eval(self) -> None:
        if self.stopped or not self.evaluator.should_eval(self.env_step):
            return
        if self._credit <= EVAL_DEFER_CREDIT and not self._needs_data():
            return  # training is owed for the data so far (and can be done): evaluate once it is
        setting = self.policy.command_mode.get_setting_eval(self.command_info())
        res = self.evaluator.eval(self.train_iter, self.env_step, setting)
        self.last_eval = res
        wall = time.time() - self._start_time
        assert self.eval_csv is not None
        self.eval_csv.write(
            {k.split("/")[-1]: v for k, v in res.items()} | {"wall_time": wall, "eval_time": res["eval/time"]}
        )
        self.scalar_writer.add_scalars({k: v for k, v in res.items() if k.startswith("eval/")}, self.env_step)
        self.logger.info(
            "[evaluator] env_step=%d train_iter=%d mean_reward=%.2f (+-%.2f, %d episodes)",
            self.env_step,
            self.train_iter,
            res["eval/mean_reward"],
            res["eval/std_reward"],
            res["eval/n_episode"],
        )
        if res["best"]:
            self.learner.save_checkpoint(os.path.join(self.run_dir, "ckpt", "best.pt"))
        if res["stop"]:
            self._finish(f"evaluation mean {res['eval/mean_reward']:.2f} >= stop_val {self.cfg.evaluator.stop_val}")

    def _check_limits(self) -> None:
        if self.stopped:
            return
        if self.env_step >= self.cfg.max_env_step:
            self._finish(f"max_env_step {self.cfg.max_env_step} reached")
        elif self.train_iter >= self.cfg.max_train_iter:
            self._finish(f"max_train_iter {self.cfg.max_train_iter} reached")

    def _finish(self, reason: str) -> None:
        """Tell the coordinator the run is over (every role stops) and stop."""
        self.logger.info("target reached or limit hit: %s", reason)
        if self.link is not None:
            self.link.call_registered(RUN_FINISH_PATH, {"reason": reason})
        self._stop(reason)

    def _stop(self, reason: str) -> None:
        if not self.stopped:
            self.stopped, self.stop_reason = True, reason

    def _log(self, force: bool = False) -> None:
        if not force and self.env_step - self._last_log_step < 1000:
            return
        self._last_log_step = self.env_step
        elapsed = max(1e-9, time.time() - self._start_time)
        scalars: Dict[str, float] = {
            "time/fps": (self.env_step - self._start_env_step) / elapsed,
            "time/time_elapsed": elapsed,
            "train/train_iter": float(self.train_iter),
        }
        if self._train_steps:
            for key, value in self._train_sums.items():
                scalars["train/loss" if key == "total_loss" else f"train/{key}"] = value / self._train_steps
            self._train_sums, self._train_steps = {}, 0
        if self.episode_returns:
            scalars["rollout/ep_rew_mean"] = float(np.mean(self.episode_returns))
            scalars["rollout/ep_len_mean"] = float(np.mean(self.episode_lens))
        scalars.update({f"data/{k}": float(v) for k, v in self.counters.items()})
        if self.buffer is not None:
            scalars.update(self.buffer.stats())
        self.scalar_writer.add_scalars(scalars, self.env_step)

    # ---- checkpoints -------------------------------------------------------------------------------------------
    def checkpoint_state(self) -> Dict[str, Any]:
        """The learner's state (model, optimizer, counters) and the poll cursor, as a weights-only checkpoint."""
        self.learner.env_step = self.env_step
        state = self.learner.state_dict()
        state["system"] = {"seq": int(self.seq), "credit": float(self._credit)}
        return state

    def save_checkpoint(self, why: str) -> Optional[str]:
        """Write ``ckpt/iteration_<n>.pt`` (rank 0). A failed write (a full disk) is logged and training goes on:
        the previous checkpoints are intact and the next one is tried after ``checkpoint_interval_min``."""
        if self.keeper is None:
            return None
        try:
            path = self.keeper.save(self.checkpoint_state(), self.train_iter)
        except OSError as error:
            self.checkpoint_failures += 1
            self.logger.error("checkpoint (%s) failed, the previous ones are intact: %s", why, error)
            return None
        self.logger.info("checkpoint (%s): %s", why, path)
        return path

    def close(self) -> None:
        """Save a last checkpoint, stop the envs, leave the group, close the logs; safe to call twice."""
        if getattr(self, "_closed", False):
            return
        self._closed = True
        try:
            if self.is_main:
                self._log(force=True)
                self.save_checkpoint(f"stop: {self.stop_reason or 'closed'}")
                self.learner.env_step = self.env_step
                self.learner.call_hook("after_run")  # learner.hook.save_ckpt_after_run: ckpt/final.pt
        finally:
            if self.link is not None:
                self.link.close()
            for manager in self._env_managers:
                manager.close()
            if self.eval_csv is not None:
                self.eval_csv.close()
            self.scalar_writer.close()
            if self._grad_hooks is not None:
                self._grad_hooks.remove()
            if self.world_size > 1:
                from nervex.system import distributed

                distributed.destroy_process_group()
        self.logger.info(
            "learner stopped (%s) at env_step=%d train_iter=%d after %.1f s",
            self.stop_reason,
            self.env_step,
            self.train_iter,
            time.time() - self._start_time,
        )


__all__ = ["LearnerRole"]
