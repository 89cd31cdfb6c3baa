"""The actor role: lease a collect task, act with the snapshot it names, store the samples, report them.

One task, end to end:

1. ``/v1/task/lease`` (kind ``collect``) gives ``{unit, n, restart_envs, snapshot, policy_iter, env_step, ...}``.
2. If ``snapshot`` differs from the loaded one, its file is read from the storage path (verified against its
   SHA-256, parsed as safetensors: never unpickled) and loaded into the collect-mode policy; a task's ``opponent``
   (a snapshot too) is loaded into an eval-mode policy seated at every act-only seat (``SerialActor.load_opponent``;
   with none, the act-only slots of ``actor.slots`` play). A lease answer without a
   task (the rate limiter waits for the learner) names the snapshot the next task would use: the idle actor loads it
   then, so new weights reach it within its back-off rather than at its next lease.
3. The exploration setting comes from the policy's command mode at the run's progress (``env_step``: env steps the
   coordinator accepted so far); before ``learning_starts`` an off-policy actor acts at random, as in serial mode.
4. ``SerialActor.collect`` runs the contract's unit with this process's env manager (same code as serial mode).
5. The samples go to the storage path as one safetensors file (``encode_samples``), then ``/v1/task/complete``
   reports its name, the sample and env-step counts and the episodes that ended (the learning slot's return, the
   length and, for games, its outcome). A 429/507 is retried by the client
   (the data stays on disk); a result the coordinator drops (the lease ran out) has its file deleted by it.

Steps 1 and 5 run on an I/O thread, one round trip per task (``lease_next``), while the actor's thread collects the
next task (``system.actor.prefetch``). The I/O thread encodes the samples; writing them and the HTTP round trip are
made by the actor's I/O process (``nervex.system.actor_io``, ``system.actor.io_process``), so that their Python work
does not take the GIL from collection. The heartbeat thread renews every lease the actor holds. An error while
collecting is reported on ``/v1/task/fail`` (the task is re-queued up to ``max_attempts``) and the env manager is
rebuilt before the next task.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Dict, List, Mapping, Optional, Tuple

import torch

from nervex.entry.builder import compile_parallel_config
from nervex.policy import set_seed
from nervex.policy.contract import CollectSpec
from nervex.system.actor_io import ActorIO, fork_available
from nervex.system.comm.auth import load_or_create_token
from nervex.system.comm.codec import decode_state_dict, flatten_arrays
from nervex.system.comm.errors import ProtocolError
from nervex.system.comm.storage import Storage
from nervex.system.protocol import TASK_COMPLETE_PATH, TASK_FAIL_PATH, TASK_LEASE_PATH
from nervex.system.role import RoleExit, RoleLink
from nervex.system.samples import encode_samples
from nervex.system.system_config import learning_starts, storage_root
from nervex.worker.actor.seating import EpisodeResult

MAX_IDLE_WAIT_S = 0.5
MAX_HINTED_WAIT_S = 30.0
"""The longest idle wait a coordinator's ``wait_s`` hint may ask for."""
MAIN_PHASES = ("collect", "snapshot", "wait", "idle")
"""Where the actor's own thread spends its time: collecting, loading snapshots, waiting for the I/O thread, idle."""
IO_PHASES = ("lease", "encode", "store", "complete")
"""The I/O thread's work per task: the lease round trip, encoding the samples, writing them, the report round trip
(writing and the round trips are the I/O process's, with ``system.actor.io_process``)."""


def check_state_matches(state: Mapping[str, Any], own: Mapping[str, Any], name: str) -> None:
    """Refuse a snapshot whose model tensors differ from the policy's own in name, shape or dtype, before anything is
    loaded (``load_state_dict`` copies every tensor that fits before it raises on one that does not).

    Raises:
        ProtocolError: 400 naming the first tensor that differs (``size mismatch``, missing or unexpected).
    """
    theirs, ours = flatten_arrays(state), flatten_arrays(own)
    for key in sorted(set(theirs) | set(ours)):
        if key not in ours or key not in theirs:
            what = "unexpected" if key in theirs else "missing"
            raise ProtocolError(400, f"snapshot {name}: {what} tensor {key!r} for this policy", field=key)
        a, b = theirs[key], ours[key]
        if isinstance(b, torch.Tensor) and (
            not isinstance(a, torch.Tensor) or a.shape != b.shape or a.dtype != b.dtype
        ):
            got = f"{tuple(a.shape)} {a.dtype}" if isinstance(a, torch.Tensor) else type(a).__name__
            raise ProtocolError(
                400,
                f"snapshot {name}: size mismatch for {key!r}: {got}, the policy has {tuple(b.shape)} {b.dtype}",
                key,
            )


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
        token = token if token is not None else load_or_create_token(run_dir)
        self.link = RoleLink(
            self.cfg, run_dir, "actor", worker_id, url=url, token=token, logger=self.logger, info={"index": index}
        )
        self.io: Optional[ActorIO] = None
        if self.settings.io_process and not fork_available():
            self.logger.warning("system.actor.io_process: this platform cannot fork; the I/O thread does its work")
        elif self.settings.io_process:  # forked before any env process or thread exists
            info = {"index": index}
            self.io = ActorIO(self.cfg, run_dir, worker_id, url, token, self.storage, info, self.logger)
        self._episodes: List[Dict[str, Any]] = []
        self._build()
        self._learning_starts = learning_starts(self.cfg)
        self.snapshot: Optional[str] = None
        self.snapshot_iter = 0
        self.opponent: Optional[str] = None  # the storage name of the opponent seated now (None: the configured)
        self._refused_snapshot: Optional[str] = None  # the last snapshot an idle preload could not load
        self._held: Dict[str, str] = {}  # lease id -> task id: leased and not yet reported (heartbeats renew them)
        self._lease_lock = threading.Lock()
        self.tasks_done = 0
        self.last_snapshot_load_s = 0.0
        self.phase_s: Dict[str, float] = dict.fromkeys(MAIN_PHASES + IO_PHASES, 0.0)  # seconds per phase of a task

    def _build(self) -> None:
        """The collector envs, the collect-only policy and the actor (its player slots); on failure, nothing open."""
        from nervex.entry.builder import make_actor, make_env_managers, make_policy

        self._make_env = lambda: make_env_managers(self.cfg, self.seed, evaluator=False)
        try:
            collector_env, _, env_info = self._make_env()
        except BaseException:
            self._close_io()
            raise
        try:
            self.policy = make_policy(self.cfg, env_info, enable_field=["collect", "command"])
            self.contract = type(self.policy).contract(self.policy.cfg)
            self.actor = make_actor(self.cfg, collector_env, self.policy, self.seed, callbacks=self)
        except BaseException:
            collector_env.close()
            self._close_io()
            raise
        self._make_actor = lambda env: make_actor(self.cfg, env, self.policy, self.seed, callbacks=self)

    def _timed(self, phase: str, start: float) -> float:
        now = time.perf_counter()
        self.phase_s[phase] += now - start
        return now

    # ---- SerialActor callbacks -------------------------------------------------------------------------------
    def on_episode_result(self, result: EpisodeResult) -> None:
        """An episode ended: the (first) learning slot's return and, for games, its outcome go into the report."""
        main = self.actor.seating.main
        episode: Dict[str, Any] = {"return": float(result.returns[main]), "length": max(1, int(result.length))}
        if main in result.outcomes:
            episode["outcome"] = int(result.outcomes[main])
        self._episodes.append(episode)

    # ---- the loop ------------------------------------------------------------------------------------------------
    def run(self, stop: Optional[Any] = None) -> int:
        """Register, heartbeat, and run collect tasks until the coordinator says stop or ``stop`` is set.

        With ``system.actor.prefetch`` (the default) the round trips are hidden behind collection: while this thread
        collects task N, an I/O thread stores and reports task N-1 and leases task N+1 (the actor holds at most three
        leases, all renewed by the heartbeat). Without it, one task at a time: lease, collect, store, report.

        Returns:
            The number of tasks this actor completed.
        """
        if stop is not None:
            self.link.stop_requested = stop.is_set
        self.logger.info("actor %s: %s", self.link.worker_id, self.actor.seating.describe())
        self.link.register()
        self.link.start_heartbeat(self._held_leases)
        io = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nervex-actor-io")
        clean = False
        try:
            self._loop(io, stop)
            clean = True
        finally:
            io.shutdown(wait=True, cancel_futures=True)
            if clean:
                self._release_unstarted()
            self._close_io()
            self.link.close()
        main = sum(self.phase_s[k] for k in MAIN_PHASES) or 1.0
        shares = ", ".join(f"{k} {100 * self.phase_s[k] / main:.0f}%" for k in MAIN_PHASES)
        io_busy = ", ".join(f"{k} {1e3 * self.phase_s[k] / max(1, self.tasks_done):.1f} ms" for k in IO_PHASES)
        self.logger.info(
            "actor %s stops after %d task(s) with the snapshot of policy_iter %d; its time: %s; per task in the "
            "background: %s",
            self.link.worker_id,
            self.tasks_done,
            self.snapshot_iter,
            shares,
            io_busy,
        )
        return self.tasks_done

    def _loop(self, io: ThreadPoolExecutor, stop: Optional[Any]) -> None:
        prefetch = bool(self.settings.prefetch)
        wait = float(self.settings.idle_wait_s)
        done: Optional[Tuple[Mapping[str, Any], Dict[str, Any]]] = None  # collected, not yet reported
        upcoming: Future = io.submit(self._exchange, None)  # the answer with the next task
        while not self.link.stopping.is_set() and not (stop is not None and stop.is_set()):
            start = time.perf_counter()
            answer = upcoming.result()  # an error of the I/O thread (a refused report, no coordinator) surfaces here
            start = self._timed("wait", start)
            task = answer.get("task")
            if task is None:
                if answer.get("stop"):
                    break
                self._preload_snapshot(answer)
                start = time.perf_counter()
                if done is None:  # (a collected task is reported at once: the rate limiter may wait for it)
                    # the coordinator's hint keeps all idle actors' polls together at idle_polls_per_s; jittered
                    # (0.5-1.5x), so actors that started together do not poll together
                    hinted = min(MAX_HINTED_WAIT_S, float(answer.get("wait_s") or 0.0)) * random.uniform(0.5, 1.5)
                    self._idle(max(wait, hinted), stop)
                    self._timed("idle", start)
                    wait = min(MAX_IDLE_WAIT_S, wait * 2)
                upcoming, done = io.submit(self._exchange, done), None
                continue
            wait = float(self.settings.idle_wait_s)
            if prefetch:  # report the last task and lease the next one while this one is collected
                upcoming, done = io.submit(self._exchange, done, ahead=True), None
            gathered = self._gather_or_fail(task)
            if gathered is not None:
                done = (task, gathered)
            if not prefetch:
                upcoming, done = io.submit(self._exchange, done), None
        upcoming.result()
        if done is not None:  # stopped: the last collected task is still reported
            self._exchange(done, lease_next=False)

    # ---- the steps of a task -------------------------------------------------------------------------------------
    def _idle(self, seconds: float, stop: Optional[Any]) -> None:
        """Sleep ``seconds``, waking within 0.1 s when the run stops."""
        deadline = time.monotonic() + seconds
        while not self.link.stopping.is_set() and not (stop is not None and stop.is_set()):
            left = deadline - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(left, 0.1))

    def _held_leases(self) -> List[str]:
        with self._lease_lock:
            return list(self._held)

    def _gather_or_fail(self, task: Mapping[str, Any]) -> Optional[Dict[str, Any]]:
        """Collect ``task``'s samples; on an error, report the task failed and rebuild the env manager (None)."""
        try:
            return self._gather(task["payload"], task["task_id"])
        except RoleExit:
            raise
        except Exception as error:  # the env manager could not recover, a snapshot would not load ...
            self.logger.exception("task %s failed", task["task_id"])
            self._report_failure(task["task_id"], task["lease_id"], f"{type(error).__name__}: {error}")
            self._rebuild_envs()
            return None

    def _exchange(
        self, done: Optional[Tuple[Mapping[str, Any], Dict[str, Any]]], lease_next: bool = True, ahead: bool = False
    ) -> Dict[str, Any]:
        """(I/O thread) Store and report a collected task (``done``), and lease the next one, in one round trip.

        ``ahead``: the lease is a prefetch (this actor is busy with another task), which the coordinator refuses when
        it would take the last waiting task.

        Returns:
            The lease answer: ``{'task': task or None, 'stop': bool}``. A leased task is held (heartbeats renew it)
            until it is reported.
        """
        if done is None:
            answer = self._call(TASK_LEASE_PATH, {"kind": "collect", "ahead": ahead}, phase="lease")
        else:
            task, gathered = done
            answer = self._report(task, gathered, lease_next, ahead).get("next", {"task": None, "stop": False})
        task = answer.get("task")
        if task is not None:
            with self._lease_lock:
                self._held[task["lease_id"]] = task["task_id"]
        return answer

    def _report(
        self, task: Mapping[str, Any], gathered: Dict[str, Any], lease_next: bool = False, ahead: bool = False
    ) -> Dict[str, Any]:
        """(I/O thread) Store the samples and report them (``lease_next``: and lease the next collect task); returns
        the coordinator's answer, ``{'accepted': bool[, 'next': lease answer]}``."""
        task_id, lease_id = task["task_id"], task["lease_id"]
        body: Dict[str, Any] = {"task_id": task_id, "lease_id": lease_id}
        if lease_next:
            body.update(lease_next="collect", ahead=ahead)
        try:
            start = time.perf_counter()
            body["result"], data = self._result(task_id, gathered)
            self._timed("encode", start)
            answer = self._call(TASK_COMPLETE_PATH, body, data, phase="complete")
        finally:
            with self._lease_lock:
                self._held.pop(lease_id, None)
        if answer.get("accepted"):
            self.tasks_done += 1
        else:
            self.logger.info("task %s: result dropped (its lease had run out)", task_id)
        return answer

    def _gather(self, payload: Mapping[str, Any], task_id: str) -> Dict[str, Any]:
        """Act with the task's snapshot for its unit of collection; the samples and what to report of them."""
        start = time.perf_counter()
        self._load_snapshot(payload.get("snapshot"), int(payload.get("policy_iter", 0)))
        self._load_opponent(payload.get("opponent"))
        start = self._timed("snapshot", start)
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
        self._timed("collect", start)
        if not samples:
            raise RuntimeError(f"collect task {task_id} produced no samples ({env_steps} env steps)")
        return {
            "samples": samples,
            "env_steps": int(env_steps),
            "episodes": list(self._episodes),
            "policy_iter": int(self.snapshot_iter),
            "info": {k: float(v) for k, v in self.actor.stats().items() if k.startswith("env/")},
        }

    def _call(self, path: str, body: Dict[str, Any], data: bytes = b"", phase: str = "complete") -> Dict[str, Any]:
        """(I/O thread) Store ``data`` as a samples file (its name goes to ``body['result']['data']``), then POST
        ``body`` to ``path``: through the I/O process if there is one, else here."""
        if self.io is not None:
            reply = self.io.call(path, body, data, self._stop_requested)
            self.phase_s["store"] += reply["store_s"]
            self.phase_s[phase] += reply["call_s"]
            if reply["stopping"]:
                self.link.stopping.set()
            return reply["answer"]
        start = time.perf_counter()
        if data:
            body["result"]["data"] = self.storage.put(data, "samples")
            start = self._timed("store", start)
        answer = self.link.call_registered(path, body)
        self._timed(phase, start)
        return answer

    def _stop_requested(self) -> bool:
        return self.link.stopping.is_set() or self.link.stop_requested()

    def _result(self, task_id: str, gathered: Mapping[str, Any]) -> Tuple[Dict[str, Any], bytes]:
        """(I/O thread) The result to report (its ``data`` is filled in once stored) and the samples file's bytes."""
        samples = gathered["samples"]
        meta = {"nervex.task_id": task_id, "nervex.policy_iter": str(gathered["policy_iter"])}
        data = encode_samples(samples, meta)
        return {
            "data": None,
            "n_samples": len(samples),
            "env_steps": gathered["env_steps"],
            "episodes": gathered["episodes"],
            "policy_iter": gathered["policy_iter"],
            "info": gathered["info"],
        }, data

    def _release_unstarted(self) -> None:
        """Give back the leases still held when the loop ends (a prefetched task): re-queued now, not at expiry."""
        for lease_id, task_id in list(self._held.items()):
            try:
                self._report_failure(task_id, lease_id, "the actor stopped before starting the task")
            except RoleExit:  # the coordinator is gone: the lease expires there instead
                break

    def _load_snapshot(self, name: Optional[str], policy_iter: int) -> None:
        if name is None or name == self.snapshot:
            return
        start = time.perf_counter()
        state = decode_state_dict(self.storage.get(name))
        check_state_matches(state.get("model", {}), self.policy.state_dict()["model"], name)
        self.policy.collect_mode.load_state_dict(state)
        self.snapshot, self.snapshot_iter = name, int(policy_iter)
        self.last_snapshot_load_s = time.perf_counter() - start

    def _load_opponent(self, name: Optional[str]) -> None:
        """Seat the task's opponent (a policy snapshot in storage) at the act-only seats; with none, the act-only
        slots of ``actor.slots`` play."""
        if name == self.opponent:
            return
        state = None
        if name is not None:
            state = decode_state_dict(self.storage.get(name))
            check_state_matches(state.get("model", {}), self.policy.state_dict()["model"], name)
        self.actor.load_opponent(state)
        self.opponent = name

    def _preload_snapshot(self, answer: Mapping[str, Any]) -> None:
        """While no task is available (the rate limiter holds collection back until the learner has trained), load the
        snapshot the next task would name, so new weights reach an idle actor within its back-off, not at its next
        lease (a task of 512 env steps holds a 1-actor run back for ~250 gradient steps). A snapshot that will not
        load is logged once and left to the task that names it, which fails and reports it."""
        name = answer.get("snapshot")
        if not isinstance(name, str) or name in (self.snapshot, self._refused_snapshot):
            return
        start = time.perf_counter()
        try:
            self._load_snapshot(name, int(answer.get("policy_iter", 0)))
        except RoleExit:
            raise
        except Exception as error:  # a forged or truncated file, a layout for another policy ...
            self._refused_snapshot = name
            self.logger.warning("could not preload snapshot %s while idle: %s", name, error)
        self._timed("snapshot", start)

    def _report_failure(self, task_id: str, lease_id: str, reason: str) -> None:
        try:
            self.link.call_registered(TASK_FAIL_PATH, {"task_id": task_id, "lease_id": lease_id, "reason": reason})
        except ProtocolError as error:
            self.logger.warning("could not report the failure of task %s: %s", task_id, error)
        finally:
            with self._lease_lock:
                self._held.pop(lease_id, None)

    def _rebuild_envs(self) -> None:
        """A fresh env manager and actor after a failed task (the old one may hold dead processes)."""
        try:
            self.actor.close()
        except Exception:
            self.logger.exception("closing the failed env manager")
        collector_env, _, _ = self._make_env()
        self.actor = self._make_actor(collector_env)
        self.opponent = None  # the new actor seats the configured slots

    def _close_io(self) -> None:
        if self.io is not None:
            self.io.close()
            self.io = None

    def close(self) -> None:
        self._close_io()
        self.link.close()
        self.actor.close()


__all__ = ["ActorRole"]
