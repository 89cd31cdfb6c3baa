"""The coordinator's task table: collect and learn tasks, registered workers and their leases, durable in SQLite.

A task moves ``pending -> leased(worker_id, lease_id, deadline) -> done | failed``; a lease that fails or runs past its
deadline sends the task back to ``pending`` until it has been leased ``max_attempts`` times, then to ``failed``. Every
lease ever handed out is kept in a ``leases`` table, so a late or retried request is told apart from a forged one: a
lease of another worker is a 403, an unknown id a 404, a lease that is no longer current is dropped (``False``).

Durability: WAL journal with ``synchronous=FULL``. A transaction is fsynced to the WAL before ``COMMIT`` returns, so what
a method returned (and the HTTP handler acknowledged) survives a ``kill -9`` of the coordinator and a power loss of its
node. ``NORMAL`` would survive the ``kill -9`` (the WAL write sits in the OS page cache) but not a power loss: a worker
told "accepted" would keep its result file while a rebooted coordinator re-runs the task. The cost, one fsync per
state change, is small next to the rate of control messages (a few per second per worker).

Deadlines are wall-clock seconds (``time.time``), not monotonic, because they must mean the same after a restart.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import sqlite3
import threading
import time
import uuid
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional

from nervex.system.comm.errors import ProtocolError

SCHEMA_VERSION = 1
TASK_KINDS = ("collect", "learn")
TASK_STATES = ("pending", "leased", "done", "failed")
LEASE_STATES = ("active", "completed", "failed", "expired")
MAX_ID_LEN = 200
BUSY_TIMEOUT_MS = 5000

_SCHEMA = """
CREATE TABLE schema_version (version INTEGER NOT NULL);
CREATE TABLE workers (
    worker_id TEXT PRIMARY KEY,
    role TEXT NOT NULL,
    info TEXT NOT NULL,
    registered_at REAL NOT NULL,
    last_seen REAL NOT NULL
);
CREATE TABLE tasks (
    num INTEGER PRIMARY KEY AUTOINCREMENT,
    task_id TEXT NOT NULL UNIQUE,
    kind TEXT NOT NULL CHECK (kind IN ('collect', 'learn')),
    payload TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('pending', 'leased', 'done', 'failed')),
    attempts INTEGER NOT NULL DEFAULT 0,
    worker_id TEXT,
    lease_id TEXT,
    deadline REAL,
    result TEXT,
    error TEXT,
    seq INTEGER UNIQUE,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE INDEX tasks_by_kind_state ON tasks (kind, state, num);
CREATE INDEX tasks_by_state_deadline ON tasks (state, deadline);
CREATE TABLE leases (
    lease_id TEXT PRIMARY KEY,
    task_id TEXT NOT NULL REFERENCES tasks (task_id),
    worker_id TEXT NOT NULL REFERENCES workers (worker_id),
    state TEXT NOT NULL CHECK (state IN ('active', 'completed', 'failed', 'expired')),
    issued_at REAL NOT NULL,
    deadline REAL NOT NULL,
    ended_at REAL
);
"""


class TaskTableError(RuntimeError):
    """The task table's database cannot be opened: locked by another coordinator, a newer schema, not WAL-capable."""


def _to_json(value: Any, field: str) -> str:
    """Encodes a dict as canonical JSON (sorted keys, no NaN), so equal values have equal text.

    Raises:
        ProtocolError: 400 when ``value`` is not a dict or not JSON-serializable.
    """
    if not isinstance(value, dict):
        raise ProtocolError(400, f"'{field}' must be a JSON object (dict), got {type(value).__name__}", field=field)
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as e:
        raise ProtocolError(400, f"'{field}' is not JSON-serializable: {e}", field=field) from e


def _check_id(value: Any, field: str) -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_ID_LEN:
        raise ProtocolError(400, f"'{field}' must be a non-empty string of at most {MAX_ID_LEN} chars", field=field)
    return value


def _check_kind(kind: Any) -> str:
    if kind not in TASK_KINDS:
        raise ProtocolError(400, f"unknown task kind {kind!r}; expected one of {TASK_KINDS}", field="kind")
    return kind


def _acquire_lock_file(db_path: str) -> int:
    """Takes an exclusive ``flock`` on ``<db_path>.lock`` and writes this pid into it.

    The OS drops the lock when the process dies, ``kill -9`` included, so a crashed coordinator never blocks its
    successor.

    Raises:
        TaskTableError: another process (or another open TaskTable in this one) holds the lock.
    """
    lock_path = db_path + ".lock"
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip() or "unknown"
        os.close(fd)
        raise TaskTableError(
            f"task table {db_path!r} is already open by another coordinator (lock file {lock_path!r} held by pid "
            f"{holder}); stop it or point this one at another database"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
    return fd


def _release_lock_file(fd: int) -> None:
    os.ftruncate(fd, 0)
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)


def _task_dict(row: sqlite3.Row) -> Dict[str, Any]:
    task = {k: row[k] for k in row.keys() if k != "num"}
    task["payload"] = json.loads(row["payload"])
    task["result"] = None if row["result"] is None else json.loads(row["result"])
    return task


def _worker_dict(row: sqlite3.Row) -> Dict[str, Any]:
    worker = {k: row[k] for k in row.keys()}
    worker["info"] = json.loads(row["info"])
    return worker


class TaskTable:
    """The durable state machine behind the coordinator's task and worker endpoints.

    Thread-safe: one SQLite connection guarded by a lock; every state change is one ``BEGIN IMMEDIATE`` transaction.
    A second TaskTable on the same path, in this process or another, is refused while this one is open.

    Policies:
        * A result is accepted while its lease is the task's current lease, even past the deadline: the deadline only
          matters when :meth:`expire_leases` (or a heartbeat naming that lease) re-queues the task. From then on the
          lease is stale and its result is dropped, so each task has exactly one accepted result.
        * A retried ``complete`` (same lease, same result) returns True again; the same lease with another result is a
          409. A retried ``fail`` of the same lease returns True again.
        * Each accepted result gets ``seq``, one more than the largest so far (all kinds share the sequence; done tasks
          are never deleted, so a seq is never reused). :meth:`results` lists results after a given seq.

    Args:
        path: the SQLite file, on node-local disk (WAL does not work on network file systems).
        lease_s: seconds a lease lasts from its grant or its last heartbeat.
        max_attempts: leases a task may be given before a failure or expiry marks it ``failed``.
        clock: wall-clock seconds; injected by tests.

    Raises:
        TaskTableError: the database is locked by another TaskTable, has a newer schema, or refuses WAL.
    """

    def __init__(self, path: str, lease_s: float = 30.0, max_attempts: int = 3, clock: Callable[[], float] = time.time):
        if not (lease_s > 0 and math.isfinite(lease_s)):
            raise ValueError(f"TaskTable lease_s must be a positive number of seconds, got {lease_s!r}")
        if not (isinstance(max_attempts, int) and max_attempts >= 1):
            raise ValueError(f"TaskTable max_attempts must be an int >= 1, got {max_attempts!r}")
        self.path = os.path.abspath(path)
        self.lease_s = float(lease_s)
        self.max_attempts = max_attempts
        self._clock = clock
        self._lock = threading.RLock()
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        self._lock_fd: Optional[int] = _acquire_lock_file(self.path)
        try:
            self._conn: Optional[sqlite3.Connection] = self._connect()
            self._init_schema()
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ lifecycle

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=BUSY_TIMEOUT_MS / 1000)
        conn.row_factory = sqlite3.Row
        mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if mode.lower() != "wal":
            conn.close()
            raise TaskTableError(f"task table {self.path!r} refused journal_mode=WAL (got {mode!r}); use local disk")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        conn.execute("PRAGMA foreign_keys=ON")
        return conn

    def _init_schema(self) -> None:
        with self._transaction() as conn:
            exists = conn.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='schema_version'").fetchone()
            if not exists:
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        conn.execute(statement)
                conn.execute("INSERT INTO schema_version (version) VALUES (?)", (SCHEMA_VERSION,))
                return
            row = conn.execute("SELECT version FROM schema_version").fetchone()
        version = None if row is None else row["version"]
        if version != SCHEMA_VERSION:
            raise TaskTableError(
                f"task table {self.path!r} has schema version {version}, this nervex reads version {SCHEMA_VERSION}; "
                "open it with the nervex that wrote it, or start a new database"
            )

    def close(self) -> None:
        """Closes the database and releases the lock file. Safe to call twice."""
        with self._lock:
            conn, self._conn = getattr(self, "_conn", None), None
            if conn is not None:
                conn.close()
            fd, self._lock_fd = self._lock_fd, None
            if fd is not None:
                _release_lock_file(fd)

    def __enter__(self) -> TaskTable:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _require_open(self) -> sqlite3.Connection:
        if self._conn is None:
            raise TaskTableError(f"task table {self.path!r} is closed")
        return self._conn

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """One write transaction; ``BEGIN IMMEDIATE`` takes the write lock up front, so read-then-update is atomic."""
        with self._lock:
            conn = self._require_open()
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    def _query(self, sql: str, params: Iterable[Any] = ()) -> List[sqlite3.Row]:
        with self._lock:
            return self._require_open().execute(sql, tuple(params)).fetchall()

    # ------------------------------------------------------------------ workers

    def register(self, worker_id: str, role: str, info: Dict[str, Any]) -> Dict[str, Any]:
        """Registers a worker, or refreshes the record of one that registers again (after a restart).

        Args:
            worker_id: the worker's stable id.
            role: ``'actor'``, ``'learner'``, ...; fixed for a worker id.
            info: JSON metadata (host, pid, devices); replaces the stored info.

        Returns:
            The worker record: ``worker_id``, ``role``, ``info``, ``registered_at``, ``last_seen``.

        Raises:
            ProtocolError: 400 malformed arguments; 409 the id is registered with another role.
        """
        _check_id(worker_id, "worker_id")
        _check_id(role, "role")
        info_json = _to_json(info, "info")
        now = self._clock()
        with self._transaction() as conn:
            row = conn.execute("SELECT role FROM workers WHERE worker_id=?", (worker_id,)).fetchone()
            if row is None:
                conn.execute("INSERT INTO workers VALUES (?, ?, ?, ?, ?)", (worker_id, role, info_json, now, now))
            elif row["role"] != role:
                raise ProtocolError(
                    409, f"worker {worker_id!r} is registered as {row['role']!r}, not {role!r}", field="role"
                )
            else:
                conn.execute("UPDATE workers SET info=?, last_seen=? WHERE worker_id=?", (info_json, now, worker_id))
            return self._worker(conn, worker_id)

    def heartbeat(self, worker_id: str, lease_ids: Iterable[str] = ()) -> Dict[str, Any]:
        """Renews a worker's ``last_seen`` and the deadline of each listed lease that is still current.

        A listed lease past its deadline is expired here and now (its task re-queued or failed) and reported stale,
        like a lease that was already expired, re-leased or ended: the worker should abandon those tasks.

        Args:
            worker_id: a registered worker.
            lease_ids: the leases the worker is working on.

        Returns:
            ``{'worker': record, 'renewed': {lease_id: new_deadline}, 'stale': [lease_id, ...]}``.

        Raises:
            ProtocolError: 404 unknown worker or lease; 403 a lease of another worker. Nothing is renewed then.
        """
        _check_id(worker_id, "worker_id")
        lease_ids = [_check_id(lease_id, "lease_ids") for lease_id in lease_ids]
        now = self._clock()
        renewed: Dict[str, float] = {}
        stale: List[str] = []
        with self._transaction() as conn:
            self._worker(conn, worker_id)
            conn.execute("UPDATE workers SET last_seen=? WHERE worker_id=?", (now, worker_id))
            for lease_id in lease_ids:
                lease = self._owned_lease(conn, lease_id, worker_id)
                if lease["state"] == "active" and now <= lease["deadline"]:
                    renewed[lease_id] = self._renew(conn, lease, now)
                else:
                    if lease["state"] == "active":
                        self._expire(conn, lease["task_id"], now)
                    stale.append(lease_id)
            return {"worker": self._worker(conn, worker_id), "renewed": renewed, "stale": stale}

    def workers(self) -> List[Dict[str, Any]]:
        """Returns every registered worker's record, oldest registration first."""
        return [_worker_dict(row) for row in self._query("SELECT * FROM workers ORDER BY registered_at, worker_id")]

    def _worker(self, conn: sqlite3.Connection, worker_id: str) -> Dict[str, Any]:
        row = conn.execute("SELECT * FROM workers WHERE worker_id=?", (worker_id,)).fetchone()
        if row is None:
            raise ProtocolError(404, f"unknown worker {worker_id!r}; register it first", field="worker_id")
        return _worker_dict(row)

    def _owned_lease(self, conn: sqlite3.Connection, lease_id: str, worker_id: str) -> sqlite3.Row:
        lease = self._lease_row(conn, lease_id)
        if lease["worker_id"] != worker_id:
            raise ProtocolError(
                403, f"lease {lease_id!r} belongs to another worker, not {worker_id!r}", field="lease_id"
            )
        return lease

    def _renew(self, conn: sqlite3.Connection, lease: sqlite3.Row, now: float) -> float:
        deadline = now + self.lease_s
        conn.execute("UPDATE leases SET deadline=? WHERE lease_id=?", (deadline, lease["lease_id"]))
        conn.execute("UPDATE tasks SET deadline=?, updated_at=? WHERE task_id=?", (deadline, now, lease["task_id"]))
        return deadline

    # ------------------------------------------------------------------ tasks

    def add_task(self, kind: str, payload: Dict[str, Any], task_id: Optional[str] = None) -> str:
        """Adds a pending task; adding the same id with the same kind and payload again is a no-op.

        Args:
            kind: ``'collect'`` (for actors) or ``'learn'`` (for learners).
            payload: JSON task description (policy snapshot id, env cfg, ...).
            task_id: the caller's id for idempotent retries; a random one when None.

        Returns:
            The task id.

        Raises:
            ProtocolError: 400 malformed kind, id or payload; 409 the id exists with another kind or payload.
        """
        _check_kind(kind)
        task_id = uuid.uuid4().hex if task_id is None else _check_id(task_id, "task_id")
        payload_json = _to_json(payload, "payload")
        now = self._clock()
        with self._transaction() as conn:
            row = conn.execute("SELECT kind, payload FROM tasks WHERE task_id=?", (task_id,)).fetchone()
            if row is None:
                conn.execute(
                    "INSERT INTO tasks (task_id, kind, payload, state, created_at, updated_at) "
                    "VALUES (?, ?, ?, 'pending', ?, ?)",
                    (task_id, kind, payload_json, now, now),
                )
            elif (row["kind"], row["payload"]) != (kind, payload_json):
                raise ProtocolError(409, f"task {task_id!r} already exists with another kind or payload", "task_id")
        return task_id

    def lease(self, worker_id: str, kind: str) -> Optional[Dict[str, Any]]:
        """Leases the oldest pending task of ``kind`` to a worker.

        Args:
            worker_id: a registered worker.
            kind: ``'collect'`` or ``'learn'``.

        Returns:
            The task (see :meth:`get_task`) with its fresh ``lease_id`` and ``deadline``; None when none is pending.

        Raises:
            ProtocolError: 400 unknown kind; 404 unknown worker.
        """
        _check_kind(kind)
        _check_id(worker_id, "worker_id")
        now = self._clock()
        with self._transaction() as conn:
            self._worker(conn, worker_id)
            conn.execute("UPDATE workers SET last_seen=? WHERE worker_id=?", (now, worker_id))
            row = conn.execute(
                "SELECT task_id FROM tasks WHERE kind=? AND state='pending' ORDER BY num LIMIT 1", (kind,)
            ).fetchone()
            if row is None:
                return None
            lease_id, deadline = uuid.uuid4().hex, now + self.lease_s
            conn.execute(
                "UPDATE tasks SET state='leased', worker_id=?, lease_id=?, deadline=?, attempts=attempts+1, "
                "updated_at=? WHERE task_id=?",
                (worker_id, lease_id, deadline, now, row["task_id"]),
            )
            conn.execute(
                "INSERT INTO leases VALUES (?, ?, ?, 'active', ?, ?, NULL)",
                (lease_id, row["task_id"], worker_id, now, deadline),
            )
            return _task_dict(self._task_row(conn, row["task_id"]))

    def complete(self, task_id: str, lease_id: str, result: Dict[str, Any]) -> bool:
        """Records a task's result if ``lease_id`` is its current lease.

        Args:
            task_id: the task.
            lease_id: the lease the worker got with it.
            result: JSON metadata of the result (where the trajectories lie, sizes, returns).

        Returns:
            True when the result is the task's accepted one (now, or before: a retry with the same lease and result);
            False when the lease is stale (expired, failed): the caller deletes the result's file.

        Raises:
            ProtocolError: 400 malformed result or a lease of another task; 404 unknown task or lease; 409 the same
                lease already completed the task with another result.
        """
        result_json = _to_json(result, "result")
        now = self._clock()
        with self._transaction() as conn:
            lease = self._task_lease(conn, task_id, lease_id)
            if lease["state"] == "completed":
                return self._check_same_result(conn, task_id, result_json)
            if lease["state"] != "active":
                return False
            seq = conn.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM tasks").fetchone()[0]
            conn.execute(
                "UPDATE tasks SET state='done', result=?, seq=?, deadline=NULL, updated_at=? WHERE task_id=?",
                (result_json, seq, now, task_id),
            )
            self._end_lease(conn, lease_id, "completed", now)
            return True

    def fail(self, task_id: str, lease_id: str, reason: str) -> bool:
        """Gives up a leased task: back to pending, or ``failed`` once it has been leased ``max_attempts`` times.

        Args:
            task_id: the task.
            lease_id: the lease the worker got with it.
            reason: why, for the logs (stored in the task's ``error``).

        Returns:
            True when the failure is recorded (now, or before by the same lease); False when the lease is stale.

        Raises:
            ProtocolError: 400 malformed reason or a lease of another task; 404 unknown task or lease.
        """
        if not isinstance(reason, str):
            raise ProtocolError(400, f"'reason' must be a string, got {type(reason).__name__}", field="reason")
        now = self._clock()
        with self._transaction() as conn:
            lease = self._task_lease(conn, task_id, lease_id)
            if lease["state"] != "active":
                return lease["state"] == "failed"
            self._requeue_or_fail(conn, task_id, reason, now)
            self._end_lease(conn, lease_id, "failed", now)
            return True

    def expire_leases(self) -> List[str]:
        """Re-queues (or, past ``max_attempts``, fails) every leased task past its deadline.

        The coordinator calls it periodically and once on startup, for the leases that ran out while it was down.

        Returns:
            The ids of the tasks whose lease expired.
        """
        now = self._clock()
        with self._transaction() as conn:
            rows = conn.execute(
                "SELECT task_id FROM tasks WHERE state='leased' AND deadline < ? ORDER BY num", (now,)
            ).fetchall()
            for row in rows:
                self._expire(conn, row["task_id"], now)
            return [row["task_id"] for row in rows]

    def get_task(self, task_id: str) -> Dict[str, Any]:
        """Returns a task: ``task_id``, ``kind``, ``payload``, ``state``, ``attempts``, ``worker_id``, ``lease_id``,
        ``deadline``, ``result``, ``error``, ``seq``, ``created_at``, ``updated_at``.

        Raises:
            ProtocolError: 404 unknown task.
        """
        with self._lock:
            return _task_dict(self._task_row(self._require_open(), task_id))

    def lease_owner(self, lease_id: str) -> str:
        """Returns the worker a lease (current or stale) was handed to.

        Raises:
            ProtocolError: 404 unknown lease.
        """
        with self._lock:
            return str(self._lease_row(self._require_open(), lease_id)["worker_id"])

    def tasks(self, state: Optional[str] = None, kind: Optional[str] = None) -> List[Dict[str, Any]]:
        """Returns the tasks in ``state`` and of ``kind`` (None: any), oldest first.

        Raises:
            ProtocolError: 400 unknown state or kind.
        """
        if state is not None and state not in TASK_STATES:
            raise ProtocolError(400, f"unknown task state {state!r}; expected one of {TASK_STATES}", field="state")
        if kind is not None:
            _check_kind(kind)
        rows = self._query(
            "SELECT * FROM tasks WHERE (?1 IS NULL OR state=?1) AND (?2 IS NULL OR kind=?2) ORDER BY num",
            (state, kind),
        )
        return [_task_dict(row) for row in rows]

    def counts(self) -> Dict[str, int]:
        """Returns the number of tasks in each state, zeros included."""
        rows = self._query("SELECT state, COUNT(*) AS n FROM tasks GROUP BY state")
        return {**dict.fromkeys(TASK_STATES, 0), **{row["state"]: row["n"] for row in rows}}

    def pending_count(self, kind: str) -> int:
        """Returns the number of pending tasks of ``kind``, for back-pressure (refuse new work with 429 above a cap)."""
        _check_kind(kind)
        return self._query("SELECT COUNT(*) FROM tasks WHERE kind=? AND state='pending'", (kind,))[0][0]

    def results(self, kind: str, since_seq: int = 0, limit: int = 1000) -> List[Dict[str, Any]]:
        """Returns the accepted results of ``kind`` with ``seq > since_seq``, in seq order.

        A reader keeps the largest ``seq`` it has seen and asks again from there ("data announced since X").

        Returns:
            ``[{'task_id', 'kind', 'seq', 'payload', 'result'}, ...]``, at most ``limit`` of them.

        Raises:
            ProtocolError: 400 unknown kind or a malformed ``since_seq``/``limit``.
        """
        _check_kind(kind)
        for name, value in (("since_seq", since_seq), ("limit", limit)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ProtocolError(400, f"'{name}' must be an int >= 0, got {value!r}", field=name)
        rows = self._query(
            "SELECT task_id, kind, seq, payload, result FROM tasks WHERE kind=? AND seq > ? ORDER BY seq LIMIT ?",
            (kind, since_seq, limit),
        )
        return [
            {**dict(row), "payload": json.loads(row["payload"]), "result": json.loads(row["result"])} for row in rows
        ]

    # ------------------------------------------------------------------ transitions (inside a transaction)

    def _task_row(self, conn: sqlite3.Connection, task_id: str) -> sqlite3.Row:
        _check_id(task_id, "task_id")
        row = conn.execute("SELECT * FROM tasks WHERE task_id=?", (task_id,)).fetchone()
        if row is None:
            raise ProtocolError(404, f"unknown task {task_id!r}", field="task_id")
        return row

    def _lease_row(self, conn: sqlite3.Connection, lease_id: str) -> sqlite3.Row:
        _check_id(lease_id, "lease_id")
        row = conn.execute("SELECT * FROM leases WHERE lease_id=?", (lease_id,)).fetchone()
        if row is None:
            raise ProtocolError(404, f"unknown lease {lease_id!r}", field="lease_id")
        return row

    def _task_lease(self, conn: sqlite3.Connection, task_id: str, lease_id: str) -> sqlite3.Row:
        """Returns the lease after checking that both ids exist and belong together."""
        self._task_row(conn, task_id)
        lease = self._lease_row(conn, lease_id)
        if lease["task_id"] != task_id:
            raise ProtocolError(
                400, f"lease {lease_id!r} is a lease of task {lease['task_id']!r}, not {task_id!r}", field="lease_id"
            )
        return lease

    def _check_same_result(self, conn: sqlite3.Connection, task_id: str, result_json: str) -> bool:
        stored = self._task_row(conn, task_id)["result"]
        if stored != result_json:
            raise ProtocolError(
                409, f"task {task_id!r} was already completed by this lease with another result", field="result"
            )
        return True

    def _end_lease(self, conn: sqlite3.Connection, lease_id: str, state: str, now: float) -> None:
        conn.execute("UPDATE leases SET state=?, ended_at=? WHERE lease_id=?", (state, now, lease_id))

    def _expire(self, conn: sqlite3.Connection, task_id: str, now: float) -> None:
        lease_id = self._task_row(conn, task_id)["lease_id"]
        self._requeue_or_fail(conn, task_id, f"lease {lease_id} expired", now)
        self._end_lease(conn, lease_id, "expired", now)

    def _requeue_or_fail(self, conn: sqlite3.Connection, task_id: str, reason: str, now: float) -> None:
        attempts = self._task_row(conn, task_id)["attempts"]
        state = "failed" if attempts >= self.max_attempts else "pending"
        error = f"{reason} (attempt {attempts} of {self.max_attempts})"
        conn.execute(
            "UPDATE tasks SET state=?, worker_id=NULL, lease_id=NULL, deadline=NULL, error=?, updated_at=? "
            "WHERE task_id=?",
            (state, error, now, task_id),
        )
