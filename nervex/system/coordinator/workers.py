"""The task table's records of the processes that register (``workers``): registration, heartbeats, liveness.

``WorkerRecords`` is mixed into ``nervex.system.coordinator.task_table.TaskTable`` and works on its connection: it
uses the table's ``_transaction``, ``_query``, ``_clock`` and ``lease_s``, and its lease transitions ``_lease_row``
and ``_expire`` (a heartbeat renews a current lease and expires one past its deadline).
"""

from __future__ import annotations

import sqlite3
from typing import Any, Callable, ContextManager, Dict, Iterable, List, Tuple

from nervex.system.comm.errors import ProtocolError
from nervex.system.coordinator.schema import check_id, to_json, worker_record


class WorkerRecords:
    """Registration, heartbeats (one worker's or a manager's batch) and liveness, over ``TaskTable``'s database."""

    lease_s: float
    _clock: Callable[[], float]

    # provided by TaskTable
    def _transaction(self) -> ContextManager[sqlite3.Connection]:
        raise NotImplementedError

    def _query(self, sql: str, params: Iterable[Any] = ()) -> List[sqlite3.Row]:
        raise NotImplementedError

    def _lease_row(self, conn: sqlite3.Connection, lease_id: str) -> sqlite3.Row:
        raise NotImplementedError

    def _expire(self, conn: sqlite3.Connection, task_id: str, now: float) -> None:
        raise NotImplementedError

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
        check_id(worker_id, "worker_id")
        check_id(role, "role")
        info_json = to_json(info, "info")
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
        check_id(worker_id, "worker_id")
        lease_ids = [check_id(lease_id, "lease_ids") for lease_id in lease_ids]
        with self._transaction() as conn:
            return self._heartbeat(conn, worker_id, lease_ids, self._clock())

    def heartbeat_many(self, beats: Iterable[Tuple[str, Iterable[str]]]) -> Dict[str, Dict[str, Any]]:
        """Many workers' heartbeats in one transaction (a manager relays those of its node's actors).

        Each beat is applied as :meth:`heartbeat` would apply it alone: a beat refused (unknown worker, a lease of
        another worker) changes nothing and does not stop the others.

        Args:
            beats: ``(worker_id, lease_ids)`` pairs; a worker listed twice counts once (its last pair).

        Returns:
            ``{worker_id: {'renewed': {...}, 'stale': [...]}}``, or ``{worker_id: {'error': ProtocolError}}`` for a
            refused beat.
        """
        beats = dict(beats)
        answers: Dict[str, Dict[str, Any]] = {}
        now = self._clock()
        with self._transaction() as conn:
            for worker_id, lease_ids in beats.items():
                conn.execute("SAVEPOINT beat")
                try:
                    check_id(worker_id, "worker_id")
                    ids = [check_id(lease_id, "lease_ids") for lease_id in lease_ids]
                    beat = self._heartbeat(conn, worker_id, ids, now)
                except ProtocolError as error:
                    conn.execute("ROLLBACK TO beat")
                    answers[worker_id] = {"error": error}
                else:
                    answers[worker_id] = {"renewed": beat["renewed"], "stale": beat["stale"]}
                conn.execute("RELEASE beat")
        return answers

    def _heartbeat(self, conn: sqlite3.Connection, worker_id: str, lease_ids: List[str], now: float) -> Dict[str, Any]:
        renewed: Dict[str, float] = {}
        stale: List[str] = []
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
        return [worker_record(row) for row in self._query("SELECT * FROM workers ORDER BY registered_at, worker_id")]

    def touch_workers(self, seen: Dict[str, float]) -> None:
        """Moves each listed worker's ``last_seen`` forward to its time (never back); unknown ids are skipped."""
        if not seen:
            return
        with self._transaction() as conn:
            conn.executemany(
                "UPDATE workers SET last_seen=MAX(last_seen, ?) WHERE worker_id=?",
                [(at, worker_id) for worker_id, at in seen.items()],
            )

    def live_workers(self, role: str, since: float) -> int:
        """Returns how many workers of ``role`` were seen (registered, leased, heartbeat) at ``since`` or later."""
        return int(self._query("SELECT COUNT(*) FROM workers WHERE role=? AND last_seen >= ?", (role, since))[0][0])

    def _worker(self, conn: sqlite3.Connection, worker_id: str) -> Dict[str, Any]:
        row = conn.execute("SELECT * FROM workers WHERE worker_id=?", (worker_id,)).fetchone()
        if row is None:
            raise ProtocolError(404, f"unknown worker {worker_id!r}; register it first", field="worker_id")
        return worker_record(row)

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


__all__ = ["WorkerRecords"]
