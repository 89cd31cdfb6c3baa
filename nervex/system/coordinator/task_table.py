"""The coordinator's task table: collect tasks, registered roles and their leases, durable in SQLite.

A task moves ``pending -> leased(worker_id, lease_id, deadline) -> done | failed``; a lease that fails or runs past its
deadline sends the task back to ``pending`` until it has been leased ``max_attempts`` times, then to ``failed``. Every
lease ever handed out is kept in a ``leases`` table, so a late or retried request is told apart from a forged one: a
lease of another role's process is a 403, an unknown id a 404, a lease that is no longer current is dropped
(``False``). The processes that register are called workers here, as in the ``workers`` table and the ``worker_id``
field of every request (names kept from the wire and from existing databases).

Durability: the file is a ``nervex.utils.sqlite.Database`` (WAL). By default a transaction is fsynced to the WAL before
``COMMIT`` returns (``synchronous=FULL``), so what a method returned survives a ``kill -9`` of the coordinator and a
power loss of its node. With ``group_commit`` (the coordinator's), ``COMMIT`` only writes the WAL and :meth:`sync`
flushes every transaction committed so far in one fsync; the coordinator calls it before it answers a request, so
what it acknowledged is as durable, and concurrent requests share one flush instead of queueing behind one each. The
schema and its upgrade from older versions are in ``nervex.system.coordinator.schema``.

Deadlines are wall-clock seconds (``time.time``), not monotonic, because they must mean the same after a restart.
"""

from __future__ import annotations

import json
import math
import sqlite3
import time
import uuid
from typing import Any, Callable, ContextManager, Dict, Iterable, List, Optional, Tuple

from nervex.system.comm.errors import ProtocolError
from nervex.system.coordinator.schema import (
    ADDED_INDEXES,
    SCHEMA_VERSION,
    TASK_STATES,
    check_id,
    check_kind,
    create_schema,
    task_record,
    to_json,
    upgrade_from_1,
)
from nervex.system.coordinator.workers import WorkerRecords
from nervex.utils.sqlite import Database


class TaskTableError(RuntimeError):
    """The task table's database cannot be opened: locked by another coordinator, a newer schema, not WAL-capable."""


class TaskTable(WorkerRecords):
    """The durable state machine behind the coordinator's task and worker endpoints.

    Thread-safe: one SQLite connection guarded by a lock; every state change is one ``BEGIN IMMEDIATE`` transaction.
    A second TaskTable on the same path, in this process or another, is refused while this one is open.

    Policies:
        * A result is accepted while its lease is the task's current lease, even past the deadline: the deadline only
          matters when :meth:`expire_leases` (or a heartbeat naming that lease) re-queues the task. From then on the
          lease is stale and its result is dropped, so each task has exactly one accepted result.
        * A retried ``complete`` (same lease, same result) returns True again; the same lease with another result is a
          409. A retried ``fail`` of the same lease returns True again.
        * Each accepted result gets ``seq``, one more than the largest so far (one sequence for all kinds; done tasks
          are never deleted, so a seq is never reused). :meth:`results` lists results after a given seq.

    Args:
        path: the SQLite file, on node-local disk (WAL does not work on network file systems).
        lease_s: seconds a lease lasts from its grant or its last heartbeat.
        max_attempts: leases a task may be given before a failure or expiry marks it ``failed``.
        clock: wall-clock seconds; injected by tests.
        group_commit: commits are flushed by :meth:`sync`, not each before it returns (``Database``'s group commit).

    Raises:
        TaskTableError: the database is locked by another TaskTable, has a newer schema, or refuses WAL.
    """

    def __init__(
        self,
        path: str,
        lease_s: float = 30.0,
        max_attempts: int = 3,
        clock: Callable[[], float] = time.time,
        group_commit: bool = False,
    ):
        if not (lease_s > 0 and math.isfinite(lease_s)):
            raise ValueError(f"TaskTable lease_s must be a positive number of seconds, got {lease_s!r}")
        if not (isinstance(max_attempts, int) and max_attempts >= 1):
            raise ValueError(f"TaskTable max_attempts must be an int >= 1, got {max_attempts!r}")
        self.lease_s = float(lease_s)
        self.max_attempts = max_attempts
        self._clock = clock
        self.db = Database(
            path,
            name="task table",
            exclusive=True,
            foreign_keys=True,
            error=TaskTableError,
            owner="coordinator",
            group_commit=group_commit,
        )
        """The SQLite file (for inspection and tests; change the table through the methods)."""
        self.path = self.db.path
        try:
            self._open_schema()
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ lifecycle

    def _open_schema(self) -> None:
        """Create the tables of a new database, upgrade an older one, refuse a newer one."""
        with self._transaction() as conn:
            if not conn.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='schema_version'").fetchone():
                create_schema(conn)
                return
            row = conn.execute("SELECT version FROM schema_version").fetchone()
        version = None if row is None else row["version"]
        if version == 1:
            self._upgrade_from_1()
        elif version == SCHEMA_VERSION:
            with self._transaction() as conn:
                for statement in ADDED_INDEXES:  # a database of this version written before they existed
                    conn.execute(statement)
        else:
            raise TaskTableError(
                f"task table {self.path!r} has schema version {version}, this nervex reads versions 1 and "
                f"{SCHEMA_VERSION}; open it with the nervex that wrote it, or start a new database"
            )

    def _upgrade_from_1(self) -> None:
        conn = self.db.connection()
        with self.db.lock:
            conn.execute("PRAGMA foreign_keys=OFF")  # a no-op inside a transaction: set before it
            try:
                with self._transaction() as conn:
                    upgrade_from_1(conn, TaskTableError, self.path)
            finally:
                conn.execute("PRAGMA foreign_keys=ON")

    def close(self) -> None:
        """Closes the database and releases the lock file. Safe to call twice."""
        self.db.close()

    def sync(self) -> None:
        """Make every change so far durable (one shared fsync) with ``group_commit``; a no-op without."""
        self.db.sync()

    def __enter__(self) -> TaskTable:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _transaction(self) -> ContextManager[sqlite3.Connection]:
        """One write transaction; ``BEGIN IMMEDIATE`` takes the write lock up front, so read-then-update is atomic."""
        return self.db.transaction()

    def _query(self, sql: str, params: Iterable[Any] = ()) -> List[sqlite3.Row]:
        return self.db.query(sql, params)

    # ------------------------------------------------------------------ tasks

    def add_task(self, kind: str, payload: Dict[str, Any], task_id: Optional[str] = None) -> str:
        """Adds a pending task; adding the same id with the same kind and payload again is a no-op.

        Args:
            kind: ``'collect'`` (the only kind: ``TASK_KINDS``).
            payload: JSON task description (policy snapshot id, env cfg, ...).
            task_id: the caller's id for idempotent retries; a random one when None.

        Returns:
            The task id.

        Raises:
            ProtocolError: 400 malformed kind, id or payload; 409 the id exists with another kind or payload.
        """
        return self.add_tasks(kind, [(task_id, payload)])[0]

    def add_tasks(self, kind: str, tasks: List[Tuple[Optional[str], Dict[str, Any]]]) -> List[str]:
        """Adds pending tasks, ``(task_id or None, payload)`` each, in one transaction (all or none); as
        :meth:`add_task` for each. Returns their ids."""
        check_kind(kind)
        rows = [
            (uuid.uuid4().hex if task_id is None else check_id(task_id, "task_id"), to_json(payload, "payload"))
            for task_id, payload in tasks
        ]
        now = self._clock()
        with self._transaction() as conn:
            for task_id, payload_json in rows:
                row = conn.execute("SELECT kind, payload FROM tasks WHERE task_id=?", (task_id,)).fetchone()
                if row is None:
                    conn.execute(
                        "INSERT INTO tasks (task_id, kind, payload, state, created_at, updated_at) "
                        "VALUES (?, ?, ?, 'pending', ?, ?)",
                        (task_id, kind, payload_json, now, now),
                    )
                elif (row["kind"], row["payload"]) != (kind, payload_json):
                    message = f"task {task_id!r} already exists with another kind or payload"
                    raise ProtocolError(409, message, "task_id")
        return [task_id for task_id, _ in rows]

    def lease(self, worker_id: str, kind: str) -> Optional[Dict[str, Any]]:
        """Leases the oldest pending task of ``kind`` to a worker.

        Args:
            worker_id: a registered worker.
            kind: ``'collect'``.

        Returns:
            The task (see :meth:`get_task`) with its fresh ``lease_id`` and ``deadline``; None when none is pending.

        Raises:
            ProtocolError: 400 unknown kind; 404 unknown worker.
        """
        check_kind(kind)
        check_id(worker_id, "worker_id")
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
            return task_record(self._task_row(conn, row["task_id"]))

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
        result_json = to_json(result, "result")
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
        with self.db.lock:
            return task_record(self._task_row(self.db.connection(), task_id))

    def lease_owner(self, lease_id: str) -> str:
        """Returns the worker a lease (current or stale) was handed to.

        Raises:
            ProtocolError: 404 unknown lease.
        """
        with self.db.lock:
            return str(self._lease_row(self.db.connection(), lease_id)["worker_id"])

    def tasks(self, state: Optional[str] = None, kind: Optional[str] = None) -> List[Dict[str, Any]]:
        """Returns the tasks in ``state`` and of ``kind`` (None: any), oldest first.

        Raises:
            ProtocolError: 400 unknown state or kind.
        """
        where, params = _task_filter(state, kind)
        rows = self._query(f"SELECT * FROM tasks{where} ORDER BY num", params)
        return [task_record(row) for row in rows]

    def count(self, state: Optional[str] = None, kind: Optional[str] = None) -> int:
        """Returns the number of tasks in ``state`` and of ``kind`` (None: any), from an index.

        Raises:
            ProtocolError: 400 unknown state or kind.
        """
        where, params = _task_filter(state, kind)
        return int(self._query(f"SELECT COUNT(*) FROM tasks{where}", params)[0][0])

    def counts(self) -> Dict[str, int]:
        """Returns the number of tasks in each state, zeros included."""
        rows = self._query("SELECT state, COUNT(*) AS n FROM tasks GROUP BY state")
        return {**dict.fromkeys(TASK_STATES, 0), **{row["state"]: row["n"] for row in rows}}

    def pending_count(self, kind: str, at_most: Optional[int] = None) -> int:
        """Returns the number of pending tasks of ``kind``, or ``min(that, at_most)`` (read without counting past it:
        a lease asks whether any wait, not how many)."""
        check_kind(kind)
        if at_most is None:
            return self._query("SELECT COUNT(*) FROM tasks WHERE kind=? AND state='pending'", (kind,))[0][0]
        sql = "SELECT COUNT(*) FROM (SELECT 1 FROM tasks WHERE kind=? AND state='pending' LIMIT ?)"
        return self._query(sql, (kind, int(at_most)))[0][0]

    def results(self, kind: str, since_seq: int = 0, limit: int = 1000) -> List[Dict[str, Any]]:
        """Returns the accepted results of ``kind`` with ``seq > since_seq``, in seq order.

        A reader keeps the largest ``seq`` it has seen and asks again from there ("data announced since X").

        Returns:
            ``[{'task_id', 'kind', 'seq', 'payload', 'result'}, ...]``, at most ``limit`` of them.

        Raises:
            ProtocolError: 400 unknown kind or a malformed ``since_seq``/``limit``.
        """
        check_kind(kind)
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
        check_id(task_id, "task_id")
        row = conn.execute("SELECT * FROM tasks WHERE task_id=?", (task_id,)).fetchone()
        if row is None:
            raise ProtocolError(404, f"unknown task {task_id!r}", field="task_id")
        return row

    def _lease_row(self, conn: sqlite3.Connection, lease_id: str) -> sqlite3.Row:
        check_id(lease_id, "lease_id")
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


def _task_filter(state: Optional[str], kind: Optional[str]) -> Tuple[str, Tuple[str, ...]]:
    """A ``WHERE`` on the given columns only (a ``?1 IS NULL OR ...`` form would keep SQLite from its indexes).

    Raises:
        ProtocolError: 400 unknown state or kind.
    """
    if state is not None and state not in TASK_STATES:
        raise ProtocolError(400, f"unknown task state {state!r}; expected one of {TASK_STATES}", field="state")
    if kind is not None:
        check_kind(kind)
    terms = [(column, value) for column, value in (("kind", kind), ("state", state)) if value is not None]
    if not terms:
        return "", ()
    return " WHERE " + " AND ".join(f"{column}=?" for column, _ in terms), tuple(value for _, value in terms)
