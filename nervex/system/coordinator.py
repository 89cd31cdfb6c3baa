"""The coordinator: the parallel run's task table behind signed JSON routes, with back-pressure on collection.

It owns ``<run_dir>/coordinator.sqlite`` (the ``TaskTable``: tasks, workers, leases) and
``<run_dir>/coordinator_state.sqlite`` (the run's own state: run id, config hash, finished flag, the learner's last
progress, how far the learner has polled, and an index of the accepted collect results). Both are on node-local disk,
WAL with ``synchronous=FULL``, so whatever a route acknowledged survives a ``kill -9``; a restarted coordinator
re-queues the leases that ran out while it was down and goes on.

Every route is a ``POST`` of JSON, signed (``nervex.system.comm.auth``), and idempotent: a request whose response was
lost is sent again by the client. A lease request is made so by its ``request_id``: sent again, it gets the task its
first sending leased. A background thread (every ``tick_s``) expires leases and tops up collect tasks:

* at most ``max_pending_collect`` collect tasks wait for an actor;
* none is created while ``max_queued_results`` accepted results wait for the learner, while the storage root or run
  dir has less than ``min_free_bytes`` free, after ``max_env_step`` env steps, or after the run finished;
* with ``samples_per_insert`` (off-policy, Reverb's rate limiter), a task is created only while
  ``accepted_env_steps + in_flight_env_steps <= learning_starts + sampled / samples_per_insert``, where ``sampled`` is
  what the learner reported and ``in_flight_env_steps`` counts the collect tasks already queued or running (so the
  limit is overshot by one task at most, not by the whole queue).

Which policy snapshot a new collect task names is a seam (``SnapshotSource``): by default the learner's newest; the
league manager will choose it (and an opponent) in a later step.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Dict, Mapping, Optional, Protocol, Tuple

from nervex.system.backpressure import collect_budget, free_bytes
from nervex.system.comm.auth import load_or_create_token
from nervex.system.comm.errors import ProtocolError
from nervex.system.comm.http import Server
from nervex.system.comm.storage import Storage
from nervex.system.protocol import (
    COORDINATOR_CONFIG,
    DATA_POLL_PATH,
    HEARTBEAT_PATH,
    LEAGUE_UPDATE_PATH,
    LEARNER_PROGRESS_PATH,
    MAX_POLL_LIMIT,
    PROTOCOL_VERSION,
    REGISTER_PATH,
    ROLES,
    RUN_FINISH_PATH,
    STATUS_PATH,
    TASK_COMPLETE_PATH,
    TASK_FAIL_PATH,
    TASK_LEASE_PATH,
    check_known,
    collect_spec,
    compile_coordinator_config,
    config_hash,
    learning_starts,
    optional,
    read_coordinator_url,
    require,
    require_storage_name,
    storage_root,
    validate_collect_result,
    write_coordinator_url,
)
from nervex.system.run_state import RunState
from nervex.system.task_table import TaskTable

TABLE_FILE = "coordinator.sqlite"
STATE_FILE = "coordinator_state.sqlite"
SWEEP_S = 30.0
"""The longest period between two sweeps of orphaned payload files (``Coordinator.sweep``; every ``lease_s`` if less)."""
RETRY_AFTER_S = 1.0
"""What a 429 or 507 tells the client to wait before sending again."""
LEASE_ROLES: Dict[str, Tuple[str, ...]] = {"collect": ("actor", "manager"), "learn": ("learner", "manager")}
"""Who may lease each kind of task (a manager relays tasks to the workers of its node)."""


class CoordinatorError(RuntimeError):
    """The coordinator cannot start on this run directory (it was started there with another config)."""


@dataclass(frozen=True)
class SnapshotChoice:
    """The policy a new collect task names.

    Attributes:
        snapshot: Storage name of the policy weights; None: the actor's freshly initialised policy.
        policy_iter: The learner iteration the snapshot was taken at.
        opponent: Storage name of an opponent's weights (self-play; None for one player).
    """

    snapshot: Optional[str]
    policy_iter: int
    opponent: Optional[str] = None


class SnapshotSource(Protocol):
    """Chooses the snapshot of each new collect task (the league manager's job once it exists)."""

    def choose(self) -> SnapshotChoice:
        """The snapshot the next collect task names."""
        ...


class LatestLearnerSnapshot:
    """The default ``SnapshotSource``: the newest snapshot the learner reported on ``/v1/learner/progress``.

    Args:
        progress: Returns the learner's last progress report (``{}`` before the first).
    """

    def __init__(self, progress: Callable[[], Mapping[str, Any]]) -> None:
        self._progress = progress

    def choose(self) -> SnapshotChoice:
        report = self._progress()
        return SnapshotChoice(report.get("snapshot"), int(report.get("policy_iter", 0)))


class LeagueOrLearnerSnapshot:
    """The ``SnapshotSource`` of a run with a league manager: its choice while it is alive, else the learner's newest.

    The league manager posts its choice on ``/v1/league/update`` every ``system.league.poll_s``; a choice older than
    ``stale_s`` (the league manager died or hangs; restart it by hand or from the job script) falls back to the learner's newest
    snapshot, so collection never waits on the league.

    Args:
        league: Returns the league manager's last update (``{}`` before the first).
        latest: The fallback source.
        clock: Seconds (the coordinator's clock).
        stale_s: Age after which the league's choice is ignored.
    """

    def __init__(
        self,
        league: Callable[[], Mapping[str, Any]],
        latest: SnapshotSource,
        clock: Callable[[], float],
        stale_s: float,
    ) -> None:
        self._league = league
        self._latest = latest
        self._clock = clock
        self.stale_s = float(stale_s)

    def choose(self) -> SnapshotChoice:
        update = self._league()
        choice = update.get("choice")
        if not choice or self._clock() - float(update.get("updated_at", 0.0)) > self.stale_s:
            return self._latest.choose()
        return SnapshotChoice(choice.get("snapshot"), int(choice.get("policy_iter", 0)), choice.get("opponent"))


class Coordinator:
    """The parallel run's coordinator: task table, routes, lease expiry and collect-task creation.

    Example::

        with Coordinator(cfg, "runs/cartpole_dist") as coordinator:   # or start() ... stop() in a finally
            print(coordinator.url)                                   # also in <run_dir>/coordinator.url

    Args:
        cfg: The run's compiled config (``nervex.entry.compile_parallel_config``, or its ``config.yaml`` read back);
            re-validated with ``compile_coordinator_config``, which imports no policy.
        run_dir: The run directory on node-local disk (the SQLite files, the token, ``coordinator.url``).
        token: The run's secret; ``load_or_create_token(run_dir)`` if None.
        host: Bind address; ``system.coordinator.host`` if None.
        port: Port; ``system.coordinator.port`` if None (0: the previous run's port if free, else any).
        clock: Wall-clock seconds for leases (injected by tests).
        snapshot_source: Chooses each collect task's snapshot; the learner's newest if None.
        logger: Where events go; ``nervex.system.coordinator`` if None.
    """

    config = COORDINATOR_CONFIG

    def __init__(
        self,
        cfg: Mapping[str, Any],
        run_dir: str,
        token: Optional[bytes] = None,
        host: Optional[str] = None,
        port: Optional[int] = None,
        clock: Callable[[], float] = time.time,
        snapshot_source: Optional[SnapshotSource] = None,
        logger: Optional[logging.Logger] = None,
    ) -> None:
        self.cfg = compile_coordinator_config(cfg)
        self.settings = self.cfg.system.coordinator
        self.run_dir = os.path.abspath(run_dir)
        self.config_hash = config_hash(self.cfg)
        self.logger = logger or logging.getLogger(__name__)
        self._token = token
        self._host = self.settings.host if host is None else host
        self._port = int(self.settings.port if port is None else port)
        self._clock = clock
        self._collect = collect_spec(self.cfg)
        self._learning_starts = learning_starts(self.cfg)
        self._snapshot_source = snapshot_source or LeagueOrLearnerSnapshot(
            self.league_update,
            LatestLearnerSnapshot(self.learner_progress),
            clock,
            stale_s=max(5.0, 20 * float(self.cfg.system.league.poll_s)),
        )
        self.heartbeat_s = float(self.settings.heartbeat_s or self.settings.lease_s / 3)
        self.hard_queued_results = int(self.settings.hard_queued_results or 2 * self.settings.max_queued_results)
        self._lock = threading.RLock()  # completions, ingestion and task creation, one at a time
        self._stop_event = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._server: Optional[Server] = None
        self._table: Optional[TaskTable] = None
        self._state: Optional[RunState] = None
        self._storage: Optional[Storage] = None
        self._roles: Dict[str, str] = {}
        self._last_lease: Dict[str, Tuple[str, str, str]] = {}  # worker id -> (request id, task id, lease id)
        self._last_sweep = time.monotonic()
        self.run_id = ""

    # ---- lifecycle ----------------------------------------------------------------------------------------------
    def start(self) -> Coordinator:
        """Open the databases, recover, listen, write ``coordinator.url`` and start the background pass.

        Raises:
            TaskTableError: another coordinator holds this run directory's task table.
            CoordinatorError: the run directory was started with another config.
            OSError: the address cannot be bound.
        """
        os.makedirs(self.run_dir, exist_ok=True)
        token = self._token if self._token is not None else load_or_create_token(self.run_dir)
        s = self.settings
        self._table = TaskTable(os.path.join(self.run_dir, TABLE_FILE), s.lease_s, s.max_attempts, self._clock)
        try:
            self._state = RunState(os.path.join(self.run_dir, STATE_FILE))
            self._open_run()
            self._storage = Storage(storage_root(self.cfg, self.run_dir), min_free_bytes=s.min_free_bytes)
            self._roles = {w["worker_id"]: w["role"] for w in self._table.workers()}
            self.tick()  # the leases that ran out while no coordinator was up, then the first tasks
            self._server = self._listen(token)
            write_coordinator_url(self.run_dir, self._server.url)
            self._stop_event.clear()
            self._thread = threading.Thread(target=self._tick_loop, name="nervex-coordinator-tick", daemon=True)
            self._thread.start()
        except BaseException:
            self.stop()
            raise
        self.logger.info("coordinator %s listening on %s (run dir %s)", self.run_id, self.url, self.run_dir)
        return self

    def stop(self) -> None:
        """Stop the background pass and the server, close the databases; idempotent."""
        self._stop_event.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=10.0)
        server, self._server = self._server, None
        if server is not None:
            server.stop()
        with self._lock:
            state, self._state = self._state, None
            table, self._table = self._table, None
        if state is not None:
            state.close()
        if table is not None:
            table.close()

    def __enter__(self) -> Coordinator:
        return self if self._server is not None else self.start()

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()

    @property
    def url(self) -> str:
        """``http://host:port`` of the running coordinator."""
        if self._server is None:
            raise RuntimeError("the coordinator has no address before start()")
        return self._server.url

    @property
    def task_table(self) -> TaskTable:
        """The task table (for inspection; change it through the routes)."""
        if self._table is None:
            raise RuntimeError("the coordinator's task table is closed; call start()")
        return self._table

    def learner_progress(self) -> Dict[str, Any]:
        """The learner's last ``/v1/learner/progress`` report (``{}`` before the first)."""
        return self._run_state().get("learner", {})

    def league_update(self) -> Dict[str, Any]:
        """The league manager's last ``/v1/league/update`` (``{}`` before the first)."""
        return self._run_state().get("league", {})

    def finished(self) -> Optional[Dict[str, Any]]:
        """``{reason, worker_id, at}`` once the run has finished, else None."""
        return self._run_state().get("finished")

    def _open_run(self) -> None:
        state = self._run_state()
        self.run_id = state.put_default("run_id", uuid.uuid4().hex)
        stored = state.put_default("config_hash", self.config_hash)
        if stored != self.config_hash:
            raise CoordinatorError(
                f"run dir {self.run_dir} was started with config hash {stored}, this config hashes to "
                f"{self.config_hash}: start the coordinator with the run's original config (and --set overrides), "
                "or give this config a new run dir"
            )

    def _listen(self, token: bytes) -> Server:
        """Serve on the requested port; with port 0, first try the port of the previous ``coordinator.url``."""
        previous = _port_of(read_coordinator_url(self.run_dir)) if self._port == 0 else None
        if previous:
            try:
                return self._make_server(token, previous).start()
            except OSError as error:
                self.logger.info("previous port %d is taken (%s); listening on a free one", previous, error)
        return self._make_server(token, self._port).start()

    def _make_server(self, token: bytes, port: int) -> Server:
        server = Server("coordinator", token, host=self._host, port=port, logger=self.logger)
        handlers = {
            REGISTER_PATH: self._register,
            HEARTBEAT_PATH: self._heartbeat,
            TASK_LEASE_PATH: self._lease,
            TASK_COMPLETE_PATH: self._complete,
            TASK_FAIL_PATH: self._fail,
            DATA_POLL_PATH: self._poll,
            LEARNER_PROGRESS_PATH: self._progress,
            RUN_FINISH_PATH: self._finish,
            STATUS_PATH: self._status,
            LEAGUE_UPDATE_PATH: self._league,
        }
        for path, handler in handlers.items():
            server.route(path, ["POST"], _disk_full_as_507(handler))
        return server

    def _tick_loop(self) -> None:
        while not self._stop_event.wait(self.settings.tick_s):
            try:
                self.tick()
            except Exception:
                self.logger.exception("coordinator: background pass failed; retrying in %.1f s", self.settings.tick_s)

    def tick(self) -> None:
        """One background pass: expire leases, index new results, create the collect tasks the limits allow."""
        expired = self.task_table.expire_leases()
        if expired:
            self.logger.info("re-queued %d task(s) whose lease ran out: %s", len(expired), ", ".join(expired[:10]))
        with self._lock:
            self._ingest_results()
            self._top_up()
        now = time.monotonic()
        if now - self._last_sweep >= min(SWEEP_S, max(1.0, float(self.settings.lease_s))):
            self._last_sweep = now
            self.sweep()

    def sweep(self) -> Dict[str, int]:
        """Delete what no result will ever name: temporary files of killed writers, and samples files that no accepted
        result names and that are older than a task can live (``lease_s x (max_attempts + 1)``: an actor killed after
        writing but before reporting, or whose late result was refused). Returns the counts."""
        assert self._storage is not None
        s = self.settings
        max_age = float(s.lease_s) * (int(s.max_attempts) + 1)
        temps = self._storage.collect_temp(max_age)
        orphans = 0
        for name in self._storage.list("samples"):
            age = self._storage.age(name)
            if age is not None and age > max_age and not self._run_state().holds_data(name):
                self._storage.delete(name)
                orphans += 1
        if temps or orphans:
            self.logger.info("swept %d temporary file(s) and %d orphaned samples file(s)", temps, orphans)
        return {"temp": temps, "orphans": orphans}

    # ---- routes -------------------------------------------------------------------------------------------------
    def _register(self, body: Any) -> Dict[str, Any]:
        check_known(body, ("worker_id", "role", "protocol", "config_hash", "info"))
        worker_id, role = require(body, "worker_id", str), require(body, "role", str)
        if role not in ROLES:
            raise ProtocolError(400, f"unknown role {role!r}; expected one of {', '.join(ROLES)}", field="role")
        protocol = require(body, "protocol", int)
        if protocol != PROTOCOL_VERSION:
            raise ProtocolError(
                403,
                f"worker {worker_id!r} speaks protocol {protocol}, this coordinator protocol {PROTOCOL_VERSION}: "
                "run the same nervex version in every role",
                field="protocol",
            )
        theirs = require(body, "config_hash", str)
        if theirs != self.config_hash:
            raise ProtocolError(
                403,
                f"worker {worker_id!r} has config hash {theirs}, this coordinator {self.config_hash}: start every "
                "role from the same YAML and the same --set overrides",
                field="config_hash",
            )
        self.task_table.register(worker_id, role, optional(body, "info", dict, {}))
        self._roles[worker_id] = role
        self.logger.info("registered %s %r", role, worker_id)
        return {
            "worker_id": worker_id,
            "lease_s": self.settings.lease_s,
            "heartbeat_s": self.heartbeat_s,
            "run_id": self.run_id,
            "stop": self._is_finished(),
        }

    def _heartbeat(self, body: Any) -> Dict[str, Any]:
        check_known(body, ("worker_id", "lease_ids"))
        worker_id = require(body, "worker_id", str)
        beat = self.task_table.heartbeat(worker_id, optional(body, "lease_ids", list, []))
        return {"renewed": beat["renewed"], "stale": beat["stale"], "stop": self._is_finished()}

    def _lease(self, body: Any) -> Dict[str, Any]:
        check_known(body, ("worker_id", "kind", "request_id", "ahead"))
        worker_id, kind = require(body, "worker_id", str), require(body, "kind", str)
        request_id = optional(body, "request_id", str)
        ahead = optional(body, "ahead", bool, False)  # a prefetch by a worker busy with another task
        self._check_lease_kind(self._role(worker_id), kind, "kind")
        if self._is_finished():
            self.task_table.heartbeat(worker_id, [])  # the worker was seen
            return {"task": None, "stop": True}
        with self._lock:  # a retry and its original (delivered late) get one task between them
            task = self._leased_by_request(worker_id, request_id) or self._lease_task(worker_id, kind, ahead)
            if task is not None and request_id is not None:
                self._last_lease[worker_id] = (request_id, task["task_id"], task["lease_id"])
        if task is not None:
            task = {key: task[key] for key in ("task_id", "lease_id", "deadline", "payload")}
            if kind == "collect":
                task["payload"] = self._at_lease(task["payload"])
        elif kind == "collect":
            # no task now (the rate limiter, a full queue): the snapshot the next task would name, so an idle actor
            # loads it while it waits instead of after its next lease
            choice = self._snapshot_source.choose()
            return {"task": None, "stop": False, "snapshot": choice.snapshot, "policy_iter": choice.policy_iter}
        return {"task": task, "stop": False}

    @staticmethod
    def _check_lease_kind(role: str, kind: str, field: str) -> None:
        if kind not in LEASE_ROLES:
            raise ProtocolError(400, f"unknown task kind {kind!r}; expected one of {', '.join(LEASE_ROLES)}", field)
        if role not in LEASE_ROLES[kind]:
            raise ProtocolError(403, f"a {role} may not lease {kind} tasks (only {LEASE_ROLES[kind]})", field)

    def _lease_task(self, worker_id: str, kind: str, ahead: bool = False) -> Optional[Dict[str, Any]]:
        if kind != "collect":
            return self.task_table.lease(worker_id, kind)
        pending = self.task_table.pending_count(kind)
        if pending == 0:
            # an empty queue is topped up now, not at the next tick: otherwise collection is capped at
            # max_pending_collect x n_sample per tick_s whatever the number of actors
            self._ingest_results()
            pending = self._top_up()
        if ahead and pending < 2:
            return None  # a prefetching actor does not take the last waiting task, which an idle actor may need
        return self.task_table.lease(worker_id, kind)

    def _leased_by_request(self, worker_id: str, request_id: Optional[str]) -> Optional[Dict[str, Any]]:
        """The task this worker's lease request ``request_id`` got before, while that lease is still current: the
        answer was lost and the request sent again. Kept in memory only: after a restart the first lease runs out."""
        last = self._last_lease.get(worker_id)
        if request_id is None or last is None or last[0] != request_id:
            return None
        task = self.task_table.get_task(last[1])
        return task if task["state"] == "leased" and task["lease_id"] == last[2] else None

    def _at_lease(self, payload: Dict[str, Any]) -> Dict[str, Any]:
        """A collect task's payload completed when it is handed out: the snapshot to act with is chosen now (not when
        the task was queued, so a new snapshot reaches the next task at once) and the run's progress is attached for
        the actor's exploration schedule (``env_step``: accepted env steps; ``train_iter``: the learner's)."""
        choice = self._snapshot_source.choose()
        learner = self.learner_progress()
        return dict(
            payload,
            snapshot=choice.snapshot,
            policy_iter=choice.policy_iter,
            opponent=choice.opponent,
            env_step=int(self._run_state().env_steps),
            train_iter=int(learner.get("train_iter", 0)),
        )

    def _complete(self, body: Any) -> Dict[str, Any]:
        check_known(body, ("worker_id", "task_id", "lease_id", "result", "lease_next", "request_id", "ahead"))
        worker_id, task_id = require(body, "worker_id", str), require(body, "task_id", str)
        lease_id, result = require(body, "lease_id", str), require(body, "result", dict)
        lease_next = optional(body, "lease_next", str, None)
        role = self._role(worker_id)
        if lease_next is not None:  # refused before the report is recorded: a refusal has no side effect
            self._check_lease_kind(role, lease_next, "lease_next")
        answer = {"accepted": self._complete_task(worker_id, task_id, lease_id, result)}
        if lease_next is not None:  # report and lease the next task in one round trip
            next_body = dict(
                worker_id=worker_id, kind=lease_next, request_id=body.get("request_id"), ahead=body.get("ahead")
            )
            answer["next"] = self._lease({k: v for k, v in next_body.items() if v is not None})
        return answer

    def _complete_task(self, worker_id: str, task_id: str, lease_id: str, result: Dict[str, Any]) -> bool:
        with self._lock:
            task = self.task_table.get_task(task_id)
            collect = task["kind"] == "collect"
            if collect:
                validate_collect_result(result)
            current = self._check_lease_owner(task, lease_id, worker_id)
            if current and task["state"] == "leased" and collect:
                try:
                    self._refuse_if_backpressured(task_id)
                except ProtocolError:
                    # the worker keeps its file and sends the result again: not an orphan for the sweep meanwhile
                    self._storage.touch(result["data"])
                    raise
            accepted = self.task_table.complete(task_id, lease_id, result)
            if accepted:
                self._ingest_results()
            elif collect:
                self._discard_stale_data(task_id, result["data"])
        return accepted

    def _fail(self, body: Any) -> Dict[str, Any]:
        check_known(body, ("worker_id", "task_id", "lease_id", "reason"))
        worker_id, task_id = require(body, "worker_id", str), require(body, "task_id", str)
        lease_id, reason = require(body, "lease_id", str), require(body, "reason", str)
        self._role(worker_id)
        with self._lock:
            self._check_lease_owner(self.task_table.get_task(task_id), lease_id, worker_id)
            recorded = self.task_table.fail(task_id, lease_id, reason)
        if recorded:
            self.logger.warning("worker %r failed task %s: %s", worker_id, task_id, reason[:500])
        return {"recorded": recorded}

    def _poll(self, body: Any) -> Dict[str, Any]:
        check_known(body, ("worker_id", "since_seq", "limit"))
        self._require_learner(require(body, "worker_id", str))
        since_seq = require(body, "since_seq", int, ge=0)
        limit = optional(body, "limit", int, 100, ge=1)
        if limit > MAX_POLL_LIMIT:
            raise ProtocolError(400, f"'limit' must be <= {MAX_POLL_LIMIT}, got {limit}", field="limit")
        rows = self.task_table.results("collect", since_seq, limit)
        if rows:
            self._mark_delivered(rows[-1]["seq"])
        items = [{"seq": row["seq"], "task_id": row["task_id"], "result": row["result"]} for row in rows]
        return {"items": items, "stop": self._is_finished()}

    def _progress(self, body: Any) -> Dict[str, Any]:
        fields = ("worker_id", "train_iter", "env_step", "sampled", "snapshot", "policy_iter", "buffer_size")
        check_known(body, fields)
        self._require_learner(require(body, "worker_id", str))
        report = {name: require(body, name, int, ge=0) for name in ("train_iter", "env_step", "sampled", "policy_iter")}
        report["buffer_size"] = optional(body, "buffer_size", int, ge=0)
        snapshot = optional(body, "snapshot", str)
        report["snapshot"] = None if snapshot is None else require_storage_name(snapshot, "snapshot")
        report["updated_at"] = self._clock()
        self._run_state().put("learner", report)
        return {}

    def _league(self, body: Any) -> Dict[str, Any]:
        """The league manager sets the snapshot (and opponent) of the next collect tasks; it gets the learner's
        progress and the accepted env steps back."""
        check_known(body, ("worker_id", "choice"))
        worker_id = require(body, "worker_id", str)
        role = self._role(worker_id)
        if role != "league_manager":
            raise ProtocolError(
                403, f"worker {worker_id!r} is a {role}; only the league manager may do this", "worker_id"
            )
        choice = optional(body, "choice", dict)
        if choice is not None:
            check_known(choice, ("snapshot", "policy_iter", "player", "opponent"), "choice")
            for name in ("snapshot", "opponent"):
                value = optional(choice, name, str, where="choice")
                if value is not None:
                    require_storage_name(value, f"choice.{name}")
            require(choice, "policy_iter", int, ge=0, where="choice")
            optional(choice, "player", str, where="choice")
            self._run_state().put("league", {"choice": choice, "worker_id": worker_id, "updated_at": self._clock()})
        self.task_table.heartbeat(worker_id, [])
        return {
            "learner": self.learner_progress(),
            "env_steps_accepted": self._run_state().env_steps,
            "stop": self._is_finished(),
        }

    def _finish(self, body: Any) -> Dict[str, Any]:
        check_known(body, ("worker_id", "reason"))
        worker_id, reason = require(body, "worker_id", str), require(body, "reason", str)
        self._role(worker_id)
        with self._lock:
            if not self._is_finished():
                self._run_state().put("finished", {"reason": reason, "worker_id": worker_id, "at": self._clock()})
                self.logger.info("run finished by %r: %s", worker_id, reason[:500])
        return {"stop": True}

    def _status(self, body: Any) -> Dict[str, Any]:
        check_known(body or {}, ("worker_id",))
        table, state = self.task_table, self._run_state()
        collect = {s: len(table.tasks(state=s, kind="collect")) for s in ("pending", "leased")}
        workers = [{k: w[k] for k in ("worker_id", "role", "last_seen")} for w in table.workers()]
        return {
            "run_id": self.run_id,
            "protocol": PROTOCOL_VERSION,
            "config_hash": self.config_hash,
            "tasks": table.counts(),
            "collect": collect,
            "workers": workers,
            "env_steps_accepted": state.env_steps,
            "queued_results": self._queued_results(),
            "learner": self.learner_progress(),
            "finished": self.finished(),
        }

    # ---- helpers ------------------------------------------------------------------------------------------------
    def _run_state(self) -> RunState:
        if self._state is None:
            raise RuntimeError("the coordinator's run state is closed; call start()")
        return self._state

    def _is_finished(self) -> bool:
        return self.finished() is not None

    def _role(self, worker_id: str) -> str:
        role = self._roles.get(worker_id)
        if role is None:
            raise ProtocolError(404, f"unknown worker {worker_id!r:.200}; register it first", field="worker_id")
        return role

    def _require_learner(self, worker_id: str) -> None:
        role = self._role(worker_id)
        if role != "learner":
            raise ProtocolError(403, f"worker {worker_id!r} is a {role}; only the learner may do this", "worker_id")

    def _check_lease_owner(self, task: Dict[str, Any], lease_id: str, worker_id: str) -> bool:
        """Whether ``lease_id`` is the task's current lease (leased, or done by it); 403 if the lease, current or
        stale, was handed to another worker, 404 if it was never handed out."""
        if self.task_table.lease_owner(lease_id) != worker_id:
            raise ProtocolError(403, f"lease {lease_id!r} belongs to another worker", field="lease_id")
        return task["lease_id"] == lease_id

    def _refuse_if_backpressured(self, task_id: str) -> None:
        """429 while too many results wait for the learner, 507 while the disk is nearly full: nothing recorded."""
        queued = self._queued_results()
        if queued >= self.hard_queued_results:
            raise ProtocolError(
                429,
                f"{queued} collect results wait for the learner (system.coordinator.hard_queued_results = "
                f"{self.hard_queued_results}); task {task_id!r} not recorded: keep its data and send again",
                field="result",
                retry_after=RETRY_AFTER_S,
            )
        free = self._free_bytes()
        if free < self.settings.min_free_bytes:
            raise ProtocolError(
                507,
                f"{free} bytes free under the storage root or run dir, below system.coordinator.min_free_bytes = "
                f"{self.settings.min_free_bytes}; task {task_id!r} not recorded: keep its data and send again",
                field="result",
                retry_after=RETRY_AFTER_S,
            )

    def _free_bytes(self) -> int:
        assert self._storage is not None
        return min(free_bytes(self._storage.root), free_bytes(self.run_dir))

    def _discard_stale_data(self, task_id: str, name: str) -> None:
        """Delete the payload of a dropped result, unless an accepted result names the same content."""
        assert self._storage is not None
        if self._run_state().holds_data(name):
            self.logger.info("dropped a stale result of task %s; kept %s (an accepted result names it)", task_id, name)
            return
        self._storage.delete(name)
        self.logger.info("dropped a stale result of task %s and deleted %s", task_id, name)

    def _ingest_results(self) -> None:
        state = self._run_state()
        while True:
            rows = self.task_table.results("collect", state.last_seq, 500)
            if not rows:
                return
            state.ingest(rows)

    def _queued_results(self) -> int:
        state = self._run_state()
        return state.accepted_after(int(state.get("delivered_seq", 0)))

    def _mark_delivered(self, seq: int) -> None:
        with self._lock:
            state = self._run_state()
            if seq > int(state.get("delivered_seq", 0)):
                state.put("delivered_seq", seq)

    def _top_up(self) -> int:
        """Create the collect tasks the limits allow; returns how many."""
        if self._is_finished():
            return 0
        count = self._collect_budget()
        if count <= 0:
            return 0
        state = self._run_state()
        first = int(state.get("next_task_index", 0))
        state.put("next_task_index", first + count)  # before the tasks: a crash in between only skips indices
        choice = self._snapshot_source.choose()
        for index in range(first, first + count):
            payload = {
                "unit": self._collect.unit,
                "n": self._collect.n,
                "restart_envs": self._collect.restart_envs,
                "snapshot": choice.snapshot,
                "policy_iter": choice.policy_iter,
                "task_index": index,
            }
            self.task_table.add_task("collect", payload, task_id=f"collect-{index:08d}")
        return count

    def _collect_budget(self) -> int:
        if self._queued_results() >= self.settings.max_queued_results:
            return 0
        if self._free_bytes() < self.settings.min_free_bytes:
            return 0
        table, state = self.task_table, self._run_state()
        pending = table.pending_count("collect")
        spi = self.settings.samples_per_insert
        learner = self.learner_progress()
        limit = None if spi is None else self._learning_starts + learner.get("sampled", 0) / spi
        if limit is not None and learner.get("buffer_size") is not None:
            # Reverb's min_size_to_sample: a learner whose replay buffer holds fewer than learning_starts samples (a
            # restarted learner's is empty) is not held back by what it sampled before; it is refilled up to there
            deficit = max(0, self._learning_starts - int(learner["buffer_size"]))
            limit = max(limit, int(learner.get("env_step", 0)) + deficit)
        return collect_budget(
            pending=pending,
            max_pending=self.settings.max_pending_collect,
            in_flight=pending + len(table.tasks(state="leased", kind="collect")),
            task_env_steps=self._task_env_steps(),
            accepted_env_steps=state.env_steps,
            max_env_step=self.cfg.max_env_step,
            insert_limit=limit,
        )

    def _task_env_steps(self) -> int:
        """Env steps one collect task takes: ``n`` samples, ``n`` steps of every env, or unknown (episodes)."""
        if self._collect.unit == "sample":
            return self._collect.n
        if self._collect.unit == "rollout":
            return self._collect.n * int(self.cfg.env.collector_env_num)
        return 0


def _port_of(url: Optional[str]) -> Optional[int]:
    if not url:
        return None
    try:
        return int(url.rsplit(":", 1)[1].strip("/"))
    except (IndexError, ValueError):
        return None


def _disk_full_as_507(handler: Callable[[Any], Dict[str, Any]]) -> Callable[[Any], Dict[str, Any]]:
    """A handler whose SQLite "disk is full" becomes a retryable 507 (the transaction was rolled back)."""

    def guarded(body: Any) -> Dict[str, Any]:
        try:
            return handler(body)
        except sqlite3.OperationalError as error:
            if "full" not in str(error):
                raise
            message = f"the coordinator's disk is full ({error}); nothing was recorded, send again"
            raise ProtocolError(507, message, retry_after=5.0) from None

    return guarded


__all__ = [
    "Coordinator",
    "CoordinatorError",
    "LatestLearnerSnapshot",
    "LeagueOrLearnerSnapshot",
    "SnapshotChoice",
    "SnapshotSource",
    "collect_budget",
    "free_bytes",
    "TABLE_FILE",
    "STATE_FILE",
]
