"""The task table's SQLite schema, its rows as dicts, and the upgrade of a database an older nervex wrote.

Version 1 (nervex up to issue 28) declared a second task kind, ``learn``, that no coordinator ever created;
version 2 admits ``collect`` only. A run directory of version 1 is upgraded in place when its coordinator starts again
(one transaction: the ``tasks`` table is rebuilt with the new ``CHECK``, every row and ``seq`` kept), so a run started
before the upgrade resumes. Column and table names (``workers``, ``worker_id``) are unchanged: they are also the
names on the wire.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any, Callable, Dict

from nervex.system.comm.errors import ProtocolError

SCHEMA_VERSION = 2
TASK_KINDS = ("collect",)
TASK_STATES = ("pending", "leased", "done", "failed")
LEASE_STATES = ("active", "completed", "failed", "expired")
MAX_ID_LEN = 200

_TASKS = """
CREATE TABLE {name} (
    num INTEGER PRIMARY KEY AUTOINCREMENT,
    task_id TEXT NOT NULL UNIQUE,
    kind TEXT NOT NULL CHECK (kind IN ('collect')),
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
)
"""
_TASK_INDEXES = (
    "CREATE INDEX tasks_by_kind_state ON tasks (kind, state, num)",
    "CREATE INDEX tasks_by_state_deadline ON tasks (state, deadline)",
    "CREATE INDEX tasks_by_kind_seq ON tasks (kind, seq)",
)
_OTHER_TABLES = (
    "CREATE TABLE schema_version (version INTEGER NOT NULL)",
    """CREATE TABLE workers (
        worker_id TEXT PRIMARY KEY,
        role TEXT NOT NULL,
        info TEXT NOT NULL,
        registered_at REAL NOT NULL,
        last_seen REAL NOT NULL
    )""",
    """CREATE TABLE leases (
        lease_id TEXT PRIMARY KEY,
        task_id TEXT NOT NULL REFERENCES tasks (task_id),
        worker_id TEXT NOT NULL REFERENCES workers (worker_id),
        state TEXT NOT NULL CHECK (state IN ('active', 'completed', 'failed', 'expired')),
        issued_at REAL NOT NULL,
        deadline REAL NOT NULL,
        ended_at REAL
    )""",
)


ADDED_INDEXES = ("CREATE INDEX IF NOT EXISTS tasks_by_kind_seq ON tasks (kind, seq)",)
"""Indexes added since a schema version: created when a database of that version opens (no version bump: reading
is unchanged, only faster)."""


def to_json(value: Any, field: str) -> str:
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


def check_id(value: Any, field: str) -> str:
    """``value`` if it is a non-empty string of at most ``MAX_ID_LEN`` chars, else a 400 naming ``field``."""
    if not isinstance(value, str) or not value or len(value) > MAX_ID_LEN:
        raise ProtocolError(400, f"'{field}' must be a non-empty string of at most {MAX_ID_LEN} chars", field=field)
    return value


def check_kind(kind: Any) -> str:
    """``kind`` if it is one of ``TASK_KINDS``, else a 400."""
    if kind not in TASK_KINDS:
        raise ProtocolError(400, f"unknown task kind {kind!r}; expected one of {TASK_KINDS}", field="kind")
    return kind


def task_record(row: sqlite3.Row) -> Dict[str, Any]:
    """A ``tasks`` row as the dict ``TaskTable.get_task`` returns (payload and result decoded)."""
    task = {k: row[k] for k in row.keys() if k != "num"}
    task["payload"] = json.loads(row["payload"])
    task["result"] = None if row["result"] is None else json.loads(row["result"])
    return task


def worker_record(row: sqlite3.Row) -> Dict[str, Any]:
    """A ``workers`` row as a dict (info decoded)."""
    worker = {k: row[k] for k in row.keys()}
    worker["info"] = json.loads(row["info"])
    return worker


def create_schema(conn: sqlite3.Connection) -> None:
    """Create the tables of an empty database (inside the caller's transaction)."""
    conn.execute(_TASKS.format(name="tasks"))
    for statement in _TASK_INDEXES + _OTHER_TABLES:
        conn.execute(statement)
    conn.execute("INSERT INTO schema_version (version) VALUES (?)", (SCHEMA_VERSION,))


def upgrade_from_1(conn: sqlite3.Connection, error: Callable[[str], Exception], path: str) -> None:
    """Rebuild version 1's ``tasks`` table with version 2's ``CHECK`` (inside the caller's transaction).

    SQLite cannot alter a ``CHECK``: the rows move to a new table that takes the old one's name (``num`` and ``seq``
    kept, so ``AUTOINCREMENT`` goes on from the same number). ``leases`` names ``tasks`` by name and keeps pointing
    at it. The caller turns ``foreign_keys`` off around the transaction, as SQLite's procedure for such changes asks.

    Raises:
        error: the database holds a ``learn`` task (only a program calling ``TaskTable.add_task('learn')`` directly
            could have made one); open it with the nervex that wrote it.
    """
    learn = conn.execute("SELECT COUNT(*) FROM tasks WHERE kind <> 'collect'").fetchone()[0]
    if learn:
        raise error(
            f"task table {path!r} (schema version 1) holds {learn} task(s) of a kind other than 'collect', which this "
            "nervex no longer has; open it with the nervex that wrote it, or start a new run directory"
        )
    conn.execute(_TASKS.format(name="tasks_v2"))
    conn.execute("INSERT INTO tasks_v2 SELECT * FROM tasks")
    conn.execute("DROP TABLE tasks")
    conn.execute("ALTER TABLE tasks_v2 RENAME TO tasks")
    for statement in _TASK_INDEXES:
        conn.execute(statement)
    conn.execute("UPDATE schema_version SET version=?", (SCHEMA_VERSION,))
    broken = conn.execute("PRAGMA foreign_key_check").fetchall()
    if broken:
        raise error(f"task table {path!r}: upgrading schema 1 -> 2 broke {len(broken)} reference(s); nothing changed")


__all__ = [
    "LEASE_STATES",
    "MAX_ID_LEN",
    "SCHEMA_VERSION",
    "TASK_KINDS",
    "TASK_STATES",
    "check_id",
    "check_kind",
    "create_schema",
    "task_record",
    "to_json",
    "upgrade_from_1",
    "worker_record",
]
