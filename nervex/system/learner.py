"""The learner role: train on the trajectories the coordinator announces, publish snapshots, evaluate, checkpoint.

The role is wiring around the learn loop that serial mode drives too (``nervex.worker.learner.LearnLoop``: training,
evaluation, limits, scalars) and the data intake (``nervex.system.learner_data.DataIntake``). One pass
(``LearnerRole.step``):

1. ``/v1/data/poll`` returns the accepted collect results after the learner's cursor (``since_seq``); the intake
   reads, checks and deletes each samples file (stale data, missing or bad files are counted and skipped).
2. Off-policy: the samples go to the replay buffer and earn gradient steps at the serial trainer's replay ratio,
   trained ``TRAIN_CHUNK`` at a time between polls. On-policy: each rollout is trained on as it arrives
   (``epoch_per_collect`` passes of minibatches), then a snapshot is published.
3. Every ``snapshot_every`` gradient steps (not more often than ``snapshot_min_interval_s``) the weights
   (``{'model', 'extra'}``, no optimizer) go to the storage path and ``/v1/learner/progress`` announces them with the
   progress the coordinator's rate limiter reads (``sampled``: batches x batch size).
4. The learn loop evaluates as in serial mode (``eval.csv``, TensorBoard, ``ckpt/best.pt``); reaching ``stop_val``,
   ``max_env_step`` or ``max_train_iter`` sends ``/v1/run/finish``, which stops every role.
5. ``ckpt/iteration_<n>.pt`` is written atomically every ``checkpoint_interval_min`` minutes, on SIGUSR1, and on
   SIGTERM (then the learner stops); a restarted learner loads the newest valid one, with its poll cursor.

With several ranks (``torch.distributed``, see ``nervex.system.distributed``), rank 0 alone talks HTTP: each loop it
broadcasts what it polled (as JSON bytes) and whether to stop; every rank reads the same files into its own replay
buffer (sampled with its own seed) or trains on its shard of each rollout, and gradients are averaged across ranks.
"""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from typing import Any, Deque, Dict, List, Mapping, Optional, Tuple

import torch

from nervex.entry.builder import compile_parallel_config
from nervex.policy import set_seed
from nervex.system.comm.codec import encode_state_dict
from nervex.system.comm.errors import ProtocolError
from nervex.system.comm.storage import Storage
from nervex.system.protocol import DATA_POLL_PATH, LEARNER_PROGRESS_PATH, RUN_FINISH_PATH
from nervex.system.role import RoleLink
from nervex.system.system_config import storage_root
from nervex.utils.log_helper import ScalarWriter
from nervex.worker.learner.loop import LearnLoop

from .learner_data import TRAIN_CHUNK, DataIntake, SampleCheck

PROGRESS_INTERVAL_S = 0.05
"""Progress (the rate limiter's input) is reported at most this often, and whenever a snapshot is published."""
FIRST_CHECKPOINT_S = 60.0
"""The first periodic checkpoint comes this soon (then every ``checkpoint_interval_min``): a learner killed early
keeps its training."""
SNAPSHOT_RETRY_S = 5.0
"""A snapshot write that failed (a full storage disk) is tried again after this long; actors keep the previous one."""
EVAL_DEFER_CREDIT = 4 * TRAIN_CHUNK
"""An evaluation that falls due waits for the gradient steps owed for the data so far (as serial mode evaluates after
training on what it collected), unless more than this many are owed (actors far ahead, no rate limiter)."""


class LearnerRole:
    """One learner process (one rank of a data-parallel learner): the parallel wiring around a ``LearnLoop``.

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
        # rank 0 alone writes TensorBoard and W&B (logger.wandb); first, so a missing wandb package leaves nothing open
        self.scalar_writer = ScalarWriter(run_dir if self.is_main else None, self.cfg, self.logger)
        self.storage = Storage(storage_root(self.cfg, run_dir), min_free_bytes=0)
        self.link = (
            RoleLink(self.cfg, run_dir, "learner", worker_id, url=url, token=token, logger=self.logger)
            if self.is_main
            else None
        )
        os.makedirs(os.path.join(run_dir, "ckpt"), exist_ok=True)
        self._env_managers: List[Any] = []
        self._build()
        self._init_state()
        self.learner.call_hook("before_run")  # learner.hook.load_ckpt: initial weights for a new run
        self.loop.set_progress(self.learner.env_step)
        resumed = self._resume() if self.is_main else None  # a restarted learner: its own newest checkpoint wins
        if dist is not None and self.world_size > 1:
            self._join_group(resumed)

    # ---- set-up ----------------------------------------------------------------------------------------------
    def _build(self) -> None:
        """The policy (learn, eval, command modes), learner, evaluator, buffer and the learn loop over them; rank 0
        alone keeps checkpoints and writes ``config.yaml``, ``eval.csv`` and ``best.pt``."""
        from nervex.config import save_config
        from nervex.entry.builder import make_buffer, make_env_managers, make_evaluator, make_learner, make_policy
        from nervex.system.checkpoints import CheckpointKeeper

        main_dir = self.run_dir if self.is_main else None
        try:
            _, evaluator_env, env_info = make_env_managers(self.cfg, int(self.cfg.seed), collector=False)
            self._env_managers.append(evaluator_env)
            self.env_info = env_info
            self.policy = make_policy(self.cfg, env_info, enable_field=["learn", "eval", "command"])
            self.learner = make_learner(self.cfg, self.policy, main_dir, self.logger, None)
            self.evaluator = make_evaluator(self.cfg, evaluator_env, self.policy)
            self.evaluator.logger = self.logger
            self.contract = type(self.policy).contract(self.policy.cfg)
            self.buffer = make_buffer(self.cfg, self.contract, self.seed)
        except BaseException:
            for manager in self._env_managers:
                manager.close()
            raise
        if int(self.cfg.learner.prefetch) > 0:
            self.logger.warning("learner.prefetch is not used by the parallel learner (it samples in its own loop)")
        # a keeper clears the directory's temporary files when it starts
        self.keeper = (
            CheckpointKeeper(
                os.path.join(self.run_dir, "ckpt"),
                keep=int(self.settings.keep_checkpoints),
                interval_s=60.0 * float(self.settings.checkpoint_interval_min),
                first_interval_s=FIRST_CHECKPOINT_S,
                logger=self.logger,
            )
            if self.is_main
            else None
        )
        if self.is_main:
            save_config(self.cfg, os.path.join(self.run_dir, "config.yaml"))
        self.loop = LearnLoop(
            self.cfg,
            self.policy,
            self.learner,
            self.buffer,
            self.evaluator,
            run_dir=main_dir,
            logger=self.logger,
            scalar_writer=self.scalar_writer,
            seed=self.seed,
            rank=self.rank,
            world_size=self.world_size,
        )

    def _init_state(self) -> None:
        """The data intake (poll cursor, data counters, replay-ratio credit) and the snapshot and report
        bookkeeping."""
        barrier = None
        if self.world_size > 1:
            from nervex.system import distributed

            barrier = distributed.barrier
        self.intake = DataIntake(
            self.loop,
            self.storage,
            self.settings.max_policy_lag,
            self.logger,
            is_main=self.is_main,
            barrier=barrier,
            on_trained=lambda: self._publish(force=True),
            check=SampleCheck(self.env_info.obs_space, self.env_info.act_space, self.env_info.agent_num),
        )
        self._grad_hooks: Any = None
        self.snapshot: Optional[str] = None
        self._snapshot_retry_at = 0.0
        # a restarted learner's earlier snapshots count against keep_snapshots too (else each restart leaves them)
        self._published: Deque[str] = deque(self._earlier_snapshots() if self.is_main else [])
        self._published_iter = -1
        self._published_at = 0.0
        self._reported_at = 0.0
        self._reported: Tuple[int, int] = (-1, -1)  # (train_iter, env_step) of the last progress report
        self._stop_seen = False
        self._closed = False
        self._failed = False  # a step raised: no checkpoint on the way out (it would hold what the failure left)
        self.checkpoint_failures = 0
        self.snapshot_failures = 0
        self.rollbacks = 0
        self._start_time = time.time()

    def _earlier_snapshots(self) -> List[str]:
        """The snapshot files already in the storage (a restarted learner's), oldest first."""
        names = self.storage.list("snapshot")
        return sorted(names, key=lambda name: -(self.storage.age(name) or 0.0))

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
        intake = self.intake
        counters = distributed.broadcast_json({"seq": intake.seq, "env_step": self.env_step, "credit": intake.credit})
        intake.seq, intake.credit = int(counters["seq"]), float(counters["credit"])
        self.loop.set_progress(int(counters["env_step"]))
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
        self.loop.load_state_dict(state)
        system = state.get("system", {})
        self.intake.seq = int(system.get("seq", 0))
        self.intake.credit = float(system.get("credit", 0.0))

    @property
    def env_step(self) -> int:
        """Env steps of the data received so far (the learn loop's count)."""
        return self.loop.env_step

    @property
    def train_iter(self) -> int:
        return self.loop.train_iter

    @property
    def stopped(self) -> bool:
        return self.loop.stopped

    @property
    def stop_reason(self) -> str:
        return self.loop.stop_reason

    @property
    def seq(self) -> int:
        """The poll cursor: the newest result seen."""
        return self.intake.seq

    @property
    def counters(self) -> Dict[str, int]:
        """``results`` used, ``dropped_stale``, ``missing`` and ``bad_data`` ones skipped."""
        return self.intake.counters

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
        except BaseException:
            self._failed = True
            raise
        finally:
            self.close()
        return self.stop_reason

    def step(self, external_stop: bool = False) -> bool:
        """One pass: poll, ingest, train what is owed, publish, report, evaluate. Returns whether anything happened."""
        message = self._control(external_stop)
        if message["stop"]:
            self.loop.stop(message.get("reason") or "stopped")
            self._stop_seen = True
            return True
        ingested = self.intake.ingest(message["items"])
        trained = self.intake.train_owed()
        if (ingested or trained) and not self._weights_finite():
            self._roll_back()
            return True
        if self.is_main:
            self._publish()
            self._report()
            self._maybe_eval()
            if self.loop.check_limits():  # stopped in this pass (a stopped run's next pass ends in _control)
                self._finish()
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
            elif self.intake.needs_data():
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
        if now < self._snapshot_retry_at:
            return None
        try:
            name = self.storage.put(encode_state_dict(self.snapshot_state()), "snapshot")
        except (ProtocolError, OSError) as error:
            # a full storage disk (507): actors keep the previous snapshot; training goes on and this is retried
            self.snapshot_failures += 1
            self._snapshot_retry_at = now + SNAPSHOT_RETRY_S
            self.logger.error(
                "snapshot at train_iter %d not written, actors keep %s; retrying in %.0f s: %s",
                self.train_iter,
                self.snapshot,
                SNAPSHOT_RETRY_S,
                error,
            )
            return None
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
            # one gradient step consumes batch_size samples, whatever the ranks (each samples its share)
            "sampled": self.train_iter * int(self.contract.learn.batch_size or 1),
            "snapshot": self.snapshot,
            "policy_iter": max(0, self._published_iter),
        }
        if self.buffer is not None:
            body["buffer_size"] = len(self.buffer)  # below learning_starts, the rate limiter lets it refill
        self.link.call_registered(LEARNER_PROGRESS_PATH, body)
        self._reported_at, self._reported = now, current

    # ---- evaluation, the end of the run, logs ----------------------------------------------------------------
    def _maybe_eval(self) -> None:
        if self.stopped or not self.loop.eval_due():
            return
        if self.intake.credit <= EVAL_DEFER_CREDIT and not self.intake.needs_data():
            return  # training is owed for the data so far (and can be done): evaluate once it is
        self.loop.evaluate()  # reaching stop_val stops the loop

    def _finish(self) -> None:
        """Tell the coordinator the run is over (the loop stopped it: a target or a limit); every role stops."""
        self.logger.info("run finished: %s", self.stop_reason)
        if self.link is not None:
            self.link.call_registered(RUN_FINISH_PATH, {"reason": self.stop_reason})

    def _log(self, force: bool = False) -> None:
        self.loop.write_scalars(self.intake.figures(), force)

    # ---- non-finite weights -----------------------------------------------------------------------------------
    def _weights_finite(self) -> bool:
        """Whether every tensor the policy trains is finite (what a checkpoint or a snapshot would hold)."""
        state = self.policy.state_dict()
        tensors = _tensors(state.get("model", {})) + _tensors(state.get("extra", {}))
        return all(bool(torch.isfinite(t).all()) for t in tensors if t.is_floating_point())

    def _roll_back(self) -> None:
        """Weights turned non-finite (data the checks let through, a diverging step): load the newest checkpoint
        (counters, cursor and weights), so the run goes on from there; with none, stop with a clear error."""
        self.rollbacks += 1
        if self.world_size > 1:  # every rank holds the same weights, so every rank raises here
            raise RuntimeError(
                "the learner's weights are not finite; with several ranks the step is restarted from the newest "
                "checkpoint (restart the learner step)"
            )
        loaded = self.keeper.load_latest() if self.keeper is not None else None
        if loaded is None:
            self._failed = True
            raise RuntimeError(
                "the learner's weights are not finite and no checkpoint was written yet to roll back to; nothing is "
                "checkpointed. Check the data (data/bad_data) and the learning rate"
            )
        path, state = loaded
        self._apply_checkpoint(state)
        if not self._weights_finite():  # a checkpoint an older version wrote: rolling back again would loop
            self._failed = True
            raise RuntimeError(f"the learner's weights are not finite, nor are those of its newest checkpoint {path}")
        self.logger.error(
            "the weights turned non-finite at train_iter %d: rolled back to %s (rollback %d)",
            self.train_iter,
            path,
            self.rollbacks,
        )

    # ---- checkpoints -------------------------------------------------------------------------------------------
    def checkpoint_state(self) -> Dict[str, Any]:
        """The learner's state (model, optimizer, counters) and the poll cursor, as a weights-only checkpoint."""
        state = self.loop.state_dict()
        state["system"] = {"seq": int(self.intake.seq), "credit": float(self.intake.credit)}
        return state

    def save_checkpoint(self, why: str) -> Optional[str]:
        """Write ``ckpt/iteration_<n>.pt`` (rank 0). A failed write (a full disk) is logged and training goes on:
        the previous checkpoints are intact and the next one is tried after ``checkpoint_interval_min``."""
        if self.keeper is None:
            return None
        if not self._weights_finite():
            self.checkpoint_failures += 1
            self.logger.error(
                "checkpoint (%s) not written: the weights are not finite; the previous ones are kept", why
            )
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
        if self._closed:
            return
        self._closed = True
        try:
            if self.is_main and self._failed:
                self.logger.error("a step failed: no checkpoint on the way out, the previous ones are intact")
            elif self.is_main:
                self._log(force=True)
                self.save_checkpoint(f"stop: {self.stop_reason or 'closed'}")
                self.loop.finish()  # learner.hook.save_ckpt_after_run: ckpt/final.pt
        finally:
            if self.link is not None:
                self.link.close()
            for manager in self._env_managers:
                manager.close()
            self.loop.close()
            self.scalar_writer.close()
            if self._grad_hooks is not None:
                self._grad_hooks.remove()
            if self.world_size > 1:
                from nervex.system import distributed

                distributed.destroy_process_group()
        self.logger.info(
            "learner stopped (%s) at env_step=%d train_iter=%d after %.1f s; data: %s",
            self.stop_reason,
            self.env_step,
            self.train_iter,
            time.time() - self._start_time,
            " ".join(f"{name}={count}" for name, count in self.counters.items()),
        )


def _tensors(tree: Any) -> List[torch.Tensor]:
    if isinstance(tree, torch.Tensor):
        return [tree]
    if isinstance(tree, Mapping):
        return [t for value in tree.values() for t in _tensors(value)]
    if isinstance(tree, (list, tuple)):
        return [t for value in tree for t in _tensors(value)]
    return []


__all__ = ["LearnerRole", "FIRST_CHECKPOINT_S", "SNAPSHOT_RETRY_S"]
