"""The coordinator's own durable state next to the task table: run id, config hash, the finished flag, the learner's
last progress, and the index of accepted collect results (a ``nervex.utils.sqlite.Database``: WAL,
``synchronous=FULL``)."""

from __future__ import annotations

import json
from typing import Any, Dict, List, Tuple

from nervex.utils.sqlite import Database

_STATE_SCHEMA = """
CREATE TABLE IF NOT EXISTS run_state (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS accepted (
    seq INTEGER PRIMARY KEY, task_id TEXT NOT NULL, data TEXT NOT NULL, env_steps INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS accepted_by_data ON accepted (data);
"""


class RunState:
    """The coordinator's own durable state: a key/value table and the index of accepted collect results.

    The index is derived from the task table (``TaskTable.results``), so a crash between a result's acceptance and
    its indexing is repaired by ``ingest`` at the next start.

    Args:
        path: The SQLite file (``<run_dir>/coordinator_state.sqlite``).
    """

    def __init__(self, path: str) -> None:
        self._db = Database(path, name="coordinator run state")
        self._db.script(_STATE_SCHEMA)
        self.env_steps = int(self._one("SELECT COALESCE(SUM(env_steps), 0) FROM accepted"))
        self.last_seq = int(self._one("SELECT COALESCE(MAX(seq), 0) FROM accepted"))

    def close(self) -> None:
        """Close the database; safe to call twice."""
        self._db.close()

    def get(self, key: str, default: Any = None) -> Any:
        """The value stored under ``key``, or ``default``."""
        value = self._db.one("SELECT value FROM run_state WHERE key=?", (key,))
        return default if value is None else json.loads(value)

    def put(self, key: str, value: Any) -> None:
        """Store ``value`` (JSON) under ``key``, durably."""
        self._db.execute("INSERT OR REPLACE INTO run_state VALUES (?, ?)", (key, json.dumps(value)))

    def put_default(self, key: str, value: Any) -> Any:
        """Store ``value`` unless ``key`` holds one already; returns what ``key`` holds."""
        self._db.execute("INSERT OR IGNORE INTO run_state VALUES (?, ?)", (key, json.dumps(value)))
        return self.get(key)

    def ingest(self, results: List[Dict[str, Any]]) -> None:
        """Index accepted collect results (``TaskTable.results`` rows, in seq order) in one transaction."""
        with self._db.transaction() as conn:
            for row in results:
                steps = int(row["result"]["env_steps"])
                conn.execute(
                    "INSERT INTO accepted VALUES (?, ?, ?, ?)",
                    (row["seq"], row["task_id"], row["result"]["data"], steps),
                )
        self.env_steps += sum(int(row["result"]["env_steps"]) for row in results)
        self.last_seq = max([self.last_seq] + [row["seq"] for row in results])

    def holds_data(self, name: str) -> bool:
        """Whether an accepted result names the payload ``name``."""
        return self._one("SELECT COUNT(*) FROM accepted WHERE data=?", (name,)) > 0

    def accepted_after(self, seq: int) -> int:
        """Accepted collect results with a seq above ``seq``."""
        return int(self._one("SELECT COUNT(*) FROM accepted WHERE seq > ?", (seq,)))

    def _one(self, sql: str, params: Tuple[Any, ...] = ()) -> Any:
        return self._db.one(sql, params)
