"""The actor role: lease a collect task, act with the snapshot it names, store the samples, report them.

One task, end to end (``ActorRole.run_task``):

1. ``/v1/task/lease`` (kind ``collect``) gives ``{unit, n, restart_envs, snapshot, policy_iter, env_step, ...}``.
2. If ``snapshot`` differs from the loaded one, its file is read from the storage path (verified against its
   SHA-256, parsed as safetensors: never unpickled) and loaded into the collect-mode policy.
3. The exploration setting comes from the policy's command mode at the run's progress (``env_step``: env steps the
   coordinator accepted so far); before ``learning_starts`` an off-policy actor acts at random, as in serial mode.
4. ``SerialActor.collect`` runs the contract's unit with this process's env manager (same code as serial mode).
5. The samples go to the storage path as one safetensors file (``encode_samples``), then ``/v1/task/complete``
   reports its name, the sample and env-step counts and the episodes that ended. A 429/507 is retried by the client
   (the data stays on disk); a result the coordinator drops (the lease ran out) has its file deleted by it.

The heartbeat thread renews the current lease. An error while collecting is reported on ``/v1/task/fail`` (the
task is re-queued up to ``max_attempts``) and the env manager is rebuilt before the next task.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Dict, List, Mapping, Optional

import torch

from nervex.policy import set_seed
from nervex.policy.contract import CollectSpec
from nervex.system.comm.codec import decode_state_dict
from nervex.system.comm.errors import ProtocolError
from nervex.system.comm.storage import Storage
from nervex.system.protocol import (
    TASK_COMPLETE_PATH,
    TASK_FAIL_PATH,
    TASK_LEASE_PATH,
    compile_parallel_config,
    learning_starts,
    storage_root,
)
from nervex.system.samples import encode_samples
from nervex.system.worker import WorkerExit, WorkerLink

MAX_IDLE_WAIT_S = 0.5


class ActorRole:
    """One actor process: its env manager, a collect-only policy, and the loop over collect tasks.

    Args:
        cfg: The run's config (compiled with ``compile_parallel_config`` if needed).
        run_dir: The run directory (token, ``coordinator.url``, default storage path).
        index: This actor's index: its envs are seeded from ``seed + (index + 1) * system.actor.seed_stride``.
        worker_id: Its id at the coordinator.
        url: The coordinator's (or the relaying manager's) address; None: ``<run_dir>/coordinator.url``.
        logger: Where events go.
        token: The run's secret (tests); read from the run directory if None.
    """

    def __init__(
        self,
        cfg: Mapping[str, Any],
        run_dir: str,
        index: int,
        worker_id: str,
        url: Optional[str] = None,
        logger: Optional[logging.Logger] = None,
        token: Optional[bytes] = None,
    ) -> None:
        from nervex.entry.builder import make_actor, make_env_managers, make_policy

        self.cfg = compile_parallel_config(cfg)
        self.index = int(index)
        self.logger = logger or logging.getLogger(__name__)
        self.settings = self.cfg.system.actor
        # a restarted actor (NERVEX_ACTOR_RESTARTS, set by its manager) must not replay its predecessor's episodes
        restarts = int(os.environ.get("NERVEX_ACTOR_RESTARTS", "0") or 0)
        self.seed = int(self.cfg.seed) + (self.index + 1) * int(self.settings.seed_stride) + restarts * 7919
        set_seed(self.seed)
        if self.cfg.num_threads:
            torch.set_num_threads(int(self.cfg.num_threads))
        self.storage = Storage(
            storage_root(self.cfg, run_dir), min_free_bytes=self.cfg.system.coordinator.min_free_bytes
        )
        self.link = WorkerLink(
            self.cfg, run_dir, "actor", worker_id, url=url, token=token, logger=self.logger, info={"index": index}
        )
        self._make_env = lambda: make_env_managers(self.cfg, self.seed, evaluator=False)
        collector_env, _, env_info = self._make_env()
        try:
            self.policy = make_policy(self.cfg, env_info, enable_field=["collect", "command"])
            self.contract = type(self.policy).contract(self.policy.cfg)
            self._episodes: List[Dict[str, Any]] = []
            self.actor = make_actor(self.cfg, collector_env, self.policy, self.seed, callbacks=self)
        except BaseException:
            collector_env.close()
            raise
        self._make_actor = lambda env: make_actor(self.cfg, env, self.policy, self.seed, callbacks=self)
        self._learning_starts = learning_starts(self.cfg)
        self.snapshot: Optional[str] = None
        self.snapshot_iter = 0
        self.current_lease: Optional[str] = None
        self.tasks_done = 0
        self.snapshot_loads = 0
        self.snapshot_load_times: List[float] = []

    # ---- SerialActor callbacks -------------------------------------------------------------------------------
    def on_episode_end(self, env_id: int, episode_return: float, episode_len: int) -> None:
        self._episodes.append({"return": float(episode_return), "length": max(1, int(episode_len))})

    # ---- the loop ------------------------------------------------------------------------------------------------
    def run(self, stop: Optional[Any] = None) -> int:
        """Register, heartbeat, and run collect tasks until the coordinator says stop or ``stop`` is set.

        Returns:
            The number of tasks this actor completed.
        """
        if stop is not None:
            self.link.stop_requested = stop.is_set
        self.link.register()
        self.link.start_heartbeat(lambda: [self.current_lease] if self.current_lease else [])
        wait = float(self.settings.idle_wait_s)
        try:
            while not self.link.stopping.is_set() and not (stop is not None and stop.is_set()):
                answer = self.link.call_registered(TASK_LEASE_PATH, {"kind": "collect"})
                task = answer.get("task")
                if task is None:
                    if answer.get("stop"):
                        break
                    time.sleep(wait)
                    wait = min(MAX_IDLE_WAIT_S, wait * 2)
                    continue
                wait = float(self.settings.idle_wait_s)
                self.run_task(task)
        finally:
            self.link.close()
        self.logger.info("actor %s stops after %d task(s)", self.link.worker_id, self.tasks_done)
        return self.tasks_done

    def run_task(self, task: Mapping[str, Any]) -> Optional[bool]:
        """Collect one leased task and report it; returns whether the coordinator accepted the result (None: the
        task failed here and was reported as failed)."""
        task_id, lease_id, payload = task["task_id"], task["lease_id"], task["payload"]
        self.current_lease = lease_id
        try:
            try:
                result = self._collect(payload, task_id)
            except WorkerExit:
                raise
            except Exception as error:  # the env manager could not recover, a snapshot would not load ...
                self.logger.exception("task %s failed", task_id)
                self._report_failure(task_id, lease_id, f"{type(error).__name__}: {error}")
                self._rebuild_envs()
                return None
            answer = self.link.call_registered(
                TASK_COMPLETE_PATH, {"task_id": task_id, "lease_id": lease_id, "result": result}
            )
        finally:
            self.current_lease = None
        accepted = bool(answer.get("accepted"))
        if accepted:
            self.tasks_done += 1
        else:
            self.logger.info("task %s: result dropped (its lease had run out)", task_id)
        return accepted

    def _collect(self, payload: Mapping[str, Any], task_id: str) -> Dict[str, Any]:
        self._load_snapshot(payload.get("snapshot"), int(payload.get("policy_iter", 0)))
        env_step = int(payload.get("env_step", 0))
        progress = {
            "env_step": env_step,
            "train_iter": int(payload.get("train_iter", 0)),
            "learner_step": int(payload.get("train_iter", 0)),
            "max_env_step": int(self.cfg.max_env_step),
            "max_train_iter": int(self.cfg.max_train_iter),
        }
        setting = self.policy.command_mode.get_setting_collect(progress)
        learn = self.contract.learn
        random_action = bool(learn.random_warmup and env_step < self._learning_starts)
        spec = CollectSpec(str(payload["unit"]), int(payload["n"]), bool(payload.get("restart_envs", False)))
        self._episodes = []
        before = self.actor.env_step
        samples = self.actor.collect(spec, setting, random_action=random_action)
        env_steps = self.actor.env_step - before
        if not samples:
            raise RuntimeError(f"collect task {task_id} produced no samples ({env_steps} env steps)")
        data = encode_samples(samples, {"nervex.task_id": task_id, "nervex.policy_iter": str(self.snapshot_iter)})
        name = self.storage.put(data, "samples")
        info = {k: float(v) for k, v in self.actor.stats().items() if k.startswith("env/")}
        return {
            "data": name,
            "n_samples": len(samples),
            "env_steps": int(env_steps),
            "episodes": list(self._episodes),
            "policy_iter": int(self.snapshot_iter),
            "info": info,
        }

    def _load_snapshot(self, name: Optional[str], policy_iter: int) -> None:
        if name is None or name == self.snapshot:
            return
        start = time.perf_counter()
        state = decode_state_dict(self.storage.get(name))
        self.policy.collect_mode.load_state_dict(state)
        self.snapshot, self.snapshot_iter = name, int(policy_iter)
        self.snapshot_loads += 1
        self.snapshot_load_times.append(time.perf_counter() - start)

    def _report_failure(self, task_id: str, lease_id: str, reason: str) -> None:
        try:
            self.link.call_registered(TASK_FAIL_PATH, {"task_id": task_id, "lease_id": lease_id, "reason": reason})
        except ProtocolError as error:
            self.logger.warning("could not report the failure of task %s: %s", task_id, error)

    def _rebuild_envs(self) -> None:
        """A fresh env manager and actor after a failed task (the old one may hold dead processes)."""
        try:
            self.actor.close()
        except Exception:
            self.logger.exception("closing the failed env manager")
        collector_env, _, _ = self._make_env()
        self.actor = self._make_actor(collector_env)

    def close(self) -> None:
        self.link.close()
        self.actor.close()


__all__ = ["ActorRole"]
