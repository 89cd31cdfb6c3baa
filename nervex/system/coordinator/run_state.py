"""The coordinator's own durable state next to the task table: run id, config hash, the finished flag, the learner's
last progress, and the index of accepted collect results (a ``nervex.utils.sqlite.Database``: WAL, each commit
flushed, or with ``group_commit`` flushed together by ``sync``)."""

from __future__ import annotations

import json
from typing import Any, Dict, List, Optional, Tuple

from nervex.utils.sqlite import Database

_STATE_SCHEMA = """
CREATE TABLE IF NOT EXISTS run_state (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS accepted (
    seq INTEGER PRIMARY KEY, task_id TEXT NOT NULL, data TEXT NOT NULL, env_steps INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS accepted_by_data ON accepted (data);
"""


MAX_ROW_ENV_STEPS = 2**53 - 1
"""The most env steps one accepted row may count (the routes bound each result far lower, by its task)."""


def _countable(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_ROW_ENV_STEPS


class RunState:
    """The coordinator's own durable state: a key/value table and the index of accepted collect results.

    The index is derived from the task table (``TaskTable.results``), so a crash between a result's acceptance and
    its indexing is repaired by ``ingest`` at the next start.

    Args:
        path: The SQLite file (``<run_dir>/coordinator_state.sqlite``).
        group_commit: Commits are made durable by ``sync``, not each before it returns.
    """

    def __init__(self, path: str, group_commit: bool = False) -> None:
        self._db = Database(path, name="coordinator run state", group_commit=group_commit)
        self._values: Dict[str, Optional[str]] = {}  # key -> stored JSON or None: this process is the only writer
        self._db.script(_STATE_SCHEMA)
        # TOTAL is a float sum: it cannot overflow whatever an older version stored
        self.env_steps = int(self._one("SELECT COALESCE(TOTAL(env_steps), 0) FROM accepted"))
        self.last_seq = int(self._one("SELECT COALESCE(MAX(seq), 0) FROM accepted"))

    def close(self) -> None:
        """Close the database; safe to call twice."""
        self._db.close()

    def sync(self) -> None:
        """Make every change so far durable (one shared fsync) with ``group_commit``; a no-op without."""
        self._db.sync()

    def get(self, key: str, default: Any = None) -> Any:
        """The value stored under ``key`` (a fresh copy, read from this process's cache of the file), or ``default``."""
        if key not in self._values:
            self._values[key] = self._db.one("SELECT value FROM run_state WHERE key=?", (key,))
        text = self._values[key]
        return default if text is None else json.loads(text)

    def put(self, key: str, value: Any) -> None:
        """Store ``value`` (JSON) under ``key`` (durable after ``sync``)."""
        text = json.dumps(value)
        with self._db.lock:
            self._db.execute("INSERT OR REPLACE INTO run_state VALUES (?, ?)", (key, text))
            self._values[key] = text

    def put_default(self, key: str, value: Any) -> Any:
        """Store ``value`` unless ``key`` holds one already; returns what ``key`` holds."""
        with self._db.lock:
            self._db.execute("INSERT OR IGNORE INTO run_state VALUES (?, ?)", (key, json.dumps(value)))
            self._values.pop(key, None)
            return self.get(key)

    def ingest(self, results: List[Dict[str, Any]]) -> List[int]:
        """Index accepted collect results (``TaskTable.results`` rows, in seq order) in one transaction.

        A row whose ``env_steps`` is not an integer in ``[0, MAX_ROW_ENV_STEPS]`` or whose ``data`` is not a string
        (a database written before the routes bounded them) is indexed with 0 env steps, so one bad row never fails
        every later pass. Returns the seqs of such rows, for the caller to log.
        """
        bad, total = [], 0
        with self._db.transaction() as conn:
            for row in results:
                result = row["result"] if isinstance(row["result"], dict) else {}
                steps, data = result.get("env_steps"), result.get("data")
                if not _countable(steps) or not isinstance(data, str):
                    bad.append(row["seq"])
                    steps, data = 0, data if isinstance(data, str) else ""
                conn.execute("INSERT INTO accepted VALUES (?, ?, ?, ?)", (row["seq"], row["task_id"], data, steps))
                total += steps
        self.env_steps += total
        self.last_seq = max([self.last_seq] + [row["seq"] for row in results])
        return bad

    def holds_data(self, name: str) -> bool:
        """Whether an accepted result names the payload ``name``."""
        return self._one("SELECT COUNT(*) FROM accepted WHERE data=?", (name,)) > 0

    def accepted_after(self, seq: int) -> int:
        """Accepted collect results with a seq above ``seq``."""
        return int(self._one("SELECT COUNT(*) FROM accepted WHERE seq > ?", (seq,)))

    def _one(self, sql: str, params: Tuple[Any, ...] = ()) -> Any:
        return self._db.one(sql, params)
