"""The coordinator's state transitions, over its task table, run state and storage.

``CoordinatorState`` is what the routes (``nervex.system.coordinator.routes``) call once a request is well formed:
it knows who registered with which role, leases and completes tasks, indexes accepted results, applies back-pressure,
creates collect tasks, and deletes the files no result will name. Its methods take checked values, not request bodies;
they raise ``ProtocolError`` only for refusals that depend on the state (an unknown worker, a lease of another worker,
back-pressure). Changes are committed before a method returns and made durable by ``sync`` (group commit: one fsync
for every change so far), which the routes call before they answer.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from typing import Any, Callable, Dict, List, Mapping, Optional, Set, Tuple

from nervex.system.comm.errors import ProtocolError
from nervex.system.comm.storage import Storage
from nervex.system.coordinator.run_state import MAX_ROW_ENV_STEPS, RunState
from nervex.system.coordinator.snapshots import (
    LatestLearnerSnapshot,
    LeagueOrLearnerSnapshot,
    SnapshotChoice,
    SnapshotSource,
)
from nervex.system.coordinator.supply import RETRY_AFTER_S, TaskSupply
from nervex.system.coordinator.task_table import TaskTable
from nervex.system.protocol import PROTOCOL_VERSION, RUN_FINISHED_FILE, write_run_finished
from nervex.system.system_config import collect_spec, learning_starts

SWEEP_S = 30.0
"""The longest period between two sweeps of orphaned payload files (``CoordinatorState.sweep``; every ``lease_s`` if
less)."""
MAX_IDLE_WAIT_S = 30.0
"""The longest wait a "no task" lease answer asks of an idle actor."""
LEASE_ROLES: Dict[str, Tuple[str, ...]] = {"collect": ("actor", "manager")}
"""Who may lease each kind of task (a manager relays tasks to the actors of its node)."""


class CoordinatorError(RuntimeError):
    """The coordinator cannot start on this run directory (it was started there with another config)."""


class CoordinatorState(TaskSupply):
    """The coordinator's durable state and its transitions.

    Args:
        cfg: The compiled parallel config.
        run_dir: The run directory (its free space is watched with the storage root's).
        config_hash: The config's hash; the run directory must have been started with the same.
        table: The open task table.
        run_state: The open run state.
        storage: The run's storage (collect results' payloads).
        clock: Wall-clock seconds for leases and reports.
        snapshot_source: Chooses each collect task's snapshot; the league's or the learner's newest if None.
        logger: Where events go.

    Raises:
        CoordinatorError: the run directory was started with another config.
    """

    def __init__(
        self,
        cfg: Mapping[str, Any],
        run_dir: str,
        config_hash: str,
        table: TaskTable,
        run_state: RunState,
        storage: Storage,
        clock: Callable[[], float],
        snapshot_source: Optional[SnapshotSource],
        logger: logging.Logger,
    ) -> None:
        self.cfg = cfg
        self.settings = cfg.system.coordinator
        self.run_dir = run_dir
        self.config_hash = config_hash
        self.table = table
        self.run_state = run_state
        self.storage = storage
        self.logger = logger
        self._clock = clock
        self._collect = collect_spec(cfg)
        self._learning_starts = learning_starts(cfg)
        self.snapshot_source = snapshot_source or LeagueOrLearnerSnapshot(
            self.league_update,
            LatestLearnerSnapshot(self.learner_progress),
            clock,
            stale_s=max(5.0, 20 * float(cfg.system.league.poll_s)),
        )
        self.heartbeat_s = float(self.settings.heartbeat_s or self.settings.lease_s / 3)
        self.hard_queued_results = int(self.settings.hard_queued_results or 2 * self.settings.max_queued_results)
        self.lock = threading.RLock()
        """Completions, leases, ingestion and task creation, one at a time."""
        self.told_stop: Set[str] = set()
        """Workers answered "stop" since this process started (how ``coordinator_start --exit-when-finished`` knows
        the finished run's stop has reached them)."""
        self._roles: Dict[str, str] = {w["worker_id"]: w["role"] for w in table.workers()}
        self._last_lease: Dict[str, Tuple[str, str, str]] = {}  # worker id -> (request id, task id, lease id)
        self._last_sweep = time.monotonic()
        self._seen: Dict[str, float] = {}  # worker id -> when it last called without writing (see ``seen``)
        self.idle_wait_s = 0.0
        """How long an actor answered "no task" should wait before it asks again: the live actors over
        ``idle_polls_per_s`` (updated by ``tick``), so the idle actors' polls stay at that rate however many they are."""
        self.run_id = self._open_run()

    def _open_run(self) -> str:
        run_id = self.run_state.put_default("run_id", uuid.uuid4().hex)
        stored = self.run_state.put_default("config_hash", self.config_hash)
        if stored != self.config_hash:
            raise CoordinatorError(
                f"run dir {self.run_dir} was started with config hash {stored}, this config hashes to "
                f"{self.config_hash}: start the coordinator with the run's original config (and --set overrides), "
                "or give this config a new run dir"
            )
        finished = self.run_state.get("finished")
        if finished is not None and not os.path.exists(os.path.join(self.run_dir, RUN_FINISHED_FILE)):
            write_run_finished(self.run_dir, finished)
        return run_id

    def sync(self) -> None:
        """Make every change so far durable: both databases flushed (group commit; a route answers only after it)."""
        self.table.sync()
        self.run_state.sync()

    # ---- reading --------------------------------------------------------------------------------------------
    def learner_progress(self) -> Dict[str, Any]:
        """The learner's last progress report (``{}`` before the first)."""
        return self.run_state.get("learner", {})

    def league_update(self) -> Dict[str, Any]:
        """The league manager's last update (``{}`` before the first)."""
        return self.run_state.get("league", {})

    def finished(self) -> Optional[Dict[str, Any]]:
        """``{reason, worker_id, at}`` once the run has finished, else None."""
        return self.run_state.get("finished")

    def is_finished(self) -> bool:
        """Whether the run has finished."""
        return self.finished() is not None

    def status(self) -> Dict[str, Any]:
        """What ``/v1/status`` answers: tasks, workers, accepted env steps, queued results, progress."""
        table = self.table
        collect = {s: table.count(state=s, kind="collect") for s in ("pending", "leased")}
        workers = [{k: w[k] for k in ("worker_id", "role", "last_seen")} for w in table.workers()]
        return {
            "run_id": self.run_id,
            "protocol": PROTOCOL_VERSION,
            "config_hash": self.config_hash,
            "tasks": table.counts(),
            "collect": collect,
            "workers": workers,
            "env_steps_accepted": self.run_state.env_steps,
            "queued_results": self.queued_results(),
            "learner": self.learner_progress(),
            "finished": self.finished(),
        }

    def queued_results(self) -> int:
        """Accepted collect results the learner has not polled yet."""
        return self.run_state.accepted_after(int(self.run_state.get("delivered_seq", 0)))

    # ---- who is who -----------------------------------------------------------------------------------------
    def role_of(self, worker_id: str) -> str:
        """The role ``worker_id`` registered with.

        Raises:
            ProtocolError: 404 the worker never registered.
        """
        role = self._roles.get(worker_id)
        if role is None:
            raise ProtocolError(404, f"unknown worker {worker_id!r:.200}; register it first", field="worker_id")
        return role

    def require_role(self, worker_id: str, role: str) -> None:
        """Raises a 403 unless ``worker_id`` registered as ``role`` (404 if it never registered)."""
        actual = self.role_of(worker_id)
        if actual != role:
            raise ProtocolError(
                403, f"worker {worker_id!r} is a {actual}; only the {role.replace('_', ' ')} may do this", "worker_id"
            )

    @staticmethod
    def check_lease_kind(role: str, kind: str, field: str) -> None:
        """Raises a 400 for an unknown task kind, a 403 for a kind ``role`` may not lease."""
        if kind not in LEASE_ROLES:
            raise ProtocolError(400, f"unknown task kind {kind!r}; expected one of {', '.join(LEASE_ROLES)}", field)
        if role not in LEASE_ROLES[kind]:
            raise ProtocolError(403, f"a {role} may not lease {kind} tasks (only {LEASE_ROLES[kind]})", field)

    def register(self, worker_id: str, role: str, info: Dict[str, Any]) -> None:
        """Record a worker (again, after its restart: idempotent); 409 if it registered with another role."""
        self.table.register(worker_id, role, info)
        self._roles[worker_id] = role
        self.logger.info("registered %s %r", role, worker_id)

    def seen(self, worker_id: str) -> None:
        """Note that ``worker_id`` called: its ``last_seen``, written by the next ``tick`` (an idle actor's poll then
        reads the table and writes nothing)."""
        self._seen[worker_id] = self._clock()

    def heartbeat(self, worker_id: str, lease_ids: List[str]) -> Dict[str, Any]:
        """Renew the listed leases that are current; ``{'renewed': {lease_id: deadline}, 'stale': [...]}``."""
        return self.table.heartbeat(worker_id, lease_ids)

    def heartbeat_many(self, manager_id: str, beats: List[Tuple[str, List[Any]]]) -> Dict[str, Dict[str, Any]]:
        """A manager's batch of its actors' heartbeats (``TaskTable.heartbeat_many``); the manager is seen too."""
        return self.table.heartbeat_many([(manager_id, [])] + beats)

    # ---- leases ---------------------------------------------------------------------------------------------
    def lease(self, worker_id: str, kind: str, request_id: Optional[str], ahead: bool) -> Optional[Dict[str, Any]]:
        """Lease a task to ``worker_id``; None when none can be handed out now.

        Args:
            worker_id: A registered worker allowed to lease ``kind``.
            kind: A kind of ``LEASE_ROLES``.
            request_id: The request's id: the same id sent again (its answer was lost) gets the same task.
            ahead: A prefetch by a worker busy with another task: it does not take the last waiting task.

        Returns:
            ``{task_id, lease_id, deadline, payload}``; a collect task's payload names the snapshot chosen now and the
            run's progress (``at_lease``).
        """
        with self.lock:  # a retry and its original (delivered late) get one task between them
            task = self._leased_by_request(worker_id, request_id) or self._lease_task(worker_id, kind, ahead)
            if task is not None and request_id is not None:
                self._last_lease[worker_id] = (request_id, task["task_id"], task["lease_id"])
        if task is None:
            return None
        task = {key: task[key] for key in ("task_id", "lease_id", "deadline", "payload")}
        if kind == "collect":
            task["payload"] = self._at_lease(task["payload"])
        return task

    def _lease_task(self, worker_id: str, kind: str, ahead: bool) -> Optional[Dict[str, Any]]:
        pending = self.table.pending_count(kind, at_most=2)
        if pending == 0:
            # an empty queue is topped up now, not at the next tick: otherwise collection is capped at
            # max_pending_collect x n_sample per tick_s whatever the number of actors
            self._ingest_results()
            pending = self._top_up()
        if pending == 0 or (ahead and pending < 2):
            # a prefetching actor does not take the last waiting task, which an idle actor may need; and with none
            # waiting, the poll changes nothing but the actor's last_seen
            self.seen(worker_id)
            return None
        return self.table.lease(worker_id, kind)

    def _leased_by_request(self, worker_id: str, request_id: Optional[str]) -> Optional[Dict[str, Any]]:
        """The task this worker's lease request ``request_id`` got before, while that lease is still current: the
        answer was lost and the request sent again. Kept in memory only: after a restart the first lease runs out."""
        last = self._last_lease.get(worker_id)
        if request_id is None or last is None or last[0] != request_id:
            return None
        task = self.table.get_task(last[1])
        return task if task["state"] == "leased" and task["lease_id"] == last[2] else None

    def _at_lease(self, payload: Dict[str, Any]) -> Dict[str, Any]:
        """A collect task's payload completed when it is handed out: the snapshot to act with is chosen now (not when
        the task was queued, so a new snapshot reaches the next task at once) and the run's progress is attached for
        the actor's exploration schedule (``env_step``: accepted env steps; ``train_iter``: the learner's)."""
        choice = self.snapshot_source.choose()
        return dict(
            payload,
            snapshot=choice.snapshot,
            policy_iter=choice.policy_iter,
            opponent=choice.opponent,
            env_step=int(self.run_state.env_steps),
            train_iter=int(self.learner_progress().get("train_iter", 0)),
        )

    def next_choice(self) -> SnapshotChoice:
        """The snapshot the next collect task would name (an idle actor loads it while it waits)."""
        return self.snapshot_source.choose()

    def complete(
        self,
        worker_id: str,
        task_id: str,
        lease_id: str,
        result: Dict[str, Any],
        check_collect: Callable[[Any], Any] = lambda result: result,
    ) -> bool:
        """Record a task's result; whether it is the accepted one. ``check_collect`` checks a collect result's fields
        (raising a 400) before anything else is looked at.

        A collect result is refused with 429/507 under back-pressure (nothing recorded; the worker sends it again);
        a stale lease's result is dropped and its payload deleted unless an accepted result names the same content.

        Raises:
            ProtocolError: 403 the lease was handed to another worker; 404 unknown task or lease; 409 another result
                for the same lease; 429/507 back-pressure.
        """
        with self.lock:
            task = self.table.get_task(task_id)
            collect = task["kind"] == "collect"
            if collect:
                check_collect(result)
            current = self._check_lease_owner(task, lease_id, worker_id)
            if current and task["state"] == "leased" and collect:
                self._check_collect_result(task, result)
                try:
                    self._refuse_if_backpressured(task_id)
                except ProtocolError:
                    # the worker keeps its file and sends the result again: not an orphan for the sweep meanwhile
                    self.storage.touch(result["data"])
                    raise
            accepted = self.table.complete(task_id, lease_id, result)
            if accepted:
                self._ingest_results()
            elif collect:
                self._discard_stale_data(task_id, result["data"])
        return accepted

    def _check_collect_result(self, task: Dict[str, Any], result: Dict[str, Any]) -> None:
        """400 unless the result's env steps fit its task and its samples file exists (checked before anything is
        recorded: a forged count or a name with no file is never accepted, and the lease stays the worker's)."""
        bound, what = self._max_result_env_steps(task["payload"])
        if result["env_steps"] > bound:
            raise ProtocolError(
                400,
                f"'result.env_steps' is {result['env_steps']}, more than task {task['task_id']!r} can take ({what})",
                field="result.env_steps",
            )
        if self.storage.age(result["data"]) is None:
            raise ProtocolError(
                400,
                f"'result.data' names {result['data']}, which is not in the storage: write the file before reporting",
                field="result.data",
            )

    def _max_result_env_steps(self, payload: Dict[str, Any]) -> Tuple[int, str]:
        """The most env steps a collect task's result may report, and why."""
        unit, n = str(payload.get("unit")), int(payload.get("n", 0))
        envs = int(self.cfg.env.collector_env_num)
        if unit == "sample":  # n steps in all; the last round of the vectorized envs may overshoot by envs - 1
            return n + envs - 1, f"{n} samples over {envs} envs"
        if unit == "rollout":
            return n * envs, f"{n} steps of each of {envs} envs"
        # episodes: as long as the run's whole budget at most (and a countable number)
        bound = max(int(self.cfg.max_env_step), 1)
        return min(bound, MAX_ROW_ENV_STEPS), f"{n} episodes, at most the run's max_env_step"

    def fail(self, worker_id: str, task_id: str, lease_id: str, reason: str) -> bool:
        """Give a leased task back (re-queued, or failed after ``max_attempts``); whether the failure is recorded."""
        with self.lock:
            self._check_lease_owner(self.table.get_task(task_id), lease_id, worker_id)
            recorded = self.table.fail(task_id, lease_id, reason)
        if recorded:
            self.logger.warning("worker %r failed task %s: %s", worker_id, task_id, reason[:500])
        return recorded

    def _check_lease_owner(self, task: Dict[str, Any], lease_id: str, worker_id: str) -> bool:
        """Whether ``lease_id`` is the task's current lease (leased, or done by it); 403 if the lease, current or
        stale, was handed to another worker, 404 if it was never handed out."""
        if self.table.lease_owner(lease_id) != worker_id:
            raise ProtocolError(403, f"lease {lease_id!r} belongs to another worker", field="lease_id")
        return task["lease_id"] == lease_id

    def _discard_stale_data(self, task_id: str, name: str) -> None:
        """Delete the payload of a dropped result, unless an accepted result names the same content."""
        if self.run_state.holds_data(name):
            self.logger.info("dropped a stale result of task %s; kept %s (an accepted result names it)", task_id, name)
            return
        self.storage.delete(name)
        self.logger.info("dropped a stale result of task %s and deleted %s", task_id, name)

    # ---- the learner, the league, the end -------------------------------------------------------------------
    def poll(self, since_seq: int, limit: int) -> List[Dict[str, Any]]:
        """Accepted collect results after ``since_seq`` (at most ``limit``), marked delivered to the learner."""
        rows = self.table.results("collect", since_seq, limit)
        if rows:
            with self.lock:
                if rows[-1]["seq"] > int(self.run_state.get("delivered_seq", 0)):
                    self.run_state.put("delivered_seq", rows[-1]["seq"])
        return [{"seq": row["seq"], "task_id": row["task_id"], "result": row["result"]} for row in rows]

    def record_progress(self, report: Dict[str, Any]) -> None:
        """Store the learner's progress report (the rate limiter's input), stamped with the clock."""
        self.run_state.put("learner", dict(report, updated_at=self._clock()))

    def record_league_choice(self, worker_id: str, choice: Dict[str, Any]) -> None:
        """Store the league manager's choice of the next collect tasks' snapshot and opponent."""
        self.run_state.put("league", {"choice": choice, "worker_id": worker_id, "updated_at": self._clock()})

    def finish(self, worker_id: str, reason: str) -> None:
        """Mark the run finished (once; later calls keep the first reason)."""
        with self.lock:
            if not self.is_finished():
                record = {"reason": reason, "worker_id": worker_id, "at": self._clock()}
                write_run_finished(self.run_dir, record)  # first: no answer says stop before the launcher can tell
                self.run_state.put("finished", record)
                self.logger.info("run finished by %r: %s", worker_id, reason[:500])

    # ---- the background pass --------------------------------------------------------------------------------
    def tick(self) -> None:
        """One background pass: expire leases, index new results, create the collect tasks the limits allow, and
        sweep orphaned files every ``min(SWEEP_S, lease_s)``."""
        expired = self.table.expire_leases()
        if expired:
            self.logger.info("re-queued %d task(s) whose lease ran out: %s", len(expired), ", ".join(expired[:10]))
        with self.lock:
            self._ingest_results()
            self._top_up()
        seen, self._seen = self._seen, {}
        self.table.touch_workers(seen)
        live = self.table.live_workers("actor", self._clock() - float(self.settings.lease_s))
        self.idle_wait_s = min(MAX_IDLE_WAIT_S, live / float(self.settings.idle_polls_per_s))
        self.sync()  # nobody waits for these changes; flushed here so few are left for the next request's flush
        now = time.monotonic()
        if now - self._last_sweep >= min(SWEEP_S, max(1.0, float(self.settings.lease_s))):
            self._last_sweep = now
            self.sweep()

    def sweep(self) -> Dict[str, int]:
        """Delete what no result will ever name: temporary files of killed writers, and samples files that no accepted
        result names and that are older than a task can live (``lease_s x (max_attempts + 1)``: an actor killed after
        writing but before reporting, or whose late result was refused). Returns the counts."""
        max_age = float(self.settings.lease_s) * (int(self.settings.max_attempts) + 1)
        temps = self.storage.collect_temp(max_age)
        orphans = 0
        for name in self.storage.list("samples"):
            age = self.storage.age(name)
            if age is not None and age > max_age and not self.run_state.holds_data(name):
                self.storage.delete(name)
                orphans += 1
        if temps or orphans:
            self.logger.info("swept %d temporary file(s) and %d orphaned samples file(s)", temps, orphans)
        return {"temp": temps, "orphans": orphans}

    def _ingest_results(self) -> None:
        while True:
            rows = self.table.results("collect", self.run_state.last_seq, 500)
            if not rows:
                return
            bad = self.run_state.ingest(rows)
            if bad:
                self.logger.error(
                    "indexed %d accepted result(s) with 0 env steps: their env_steps or data cannot be counted "
                    "(seq %s)",
                    len(bad),
                    ", ".join(map(str, bad[:10])),
                )


__all__ = ["CoordinatorError", "CoordinatorState", "LEASE_ROLES", "MAX_IDLE_WAIT_S", "RETRY_AFTER_S", "SWEEP_S"]
