"""Tests of the durable SQLite helper shared by the task table, the run state and the league."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest

from nervex.utils.sqlite import Database, DatabaseError


class OwnError(RuntimeError):
    pass


def test_wal_full_sync_and_busy_timeout(tmp_path: Path) -> None:
    with Database(str(tmp_path / "a.sqlite")) as db:
        assert db.one("PRAGMA journal_mode") == "wal"
        assert db.one("PRAGMA synchronous") == 2  # FULL
        assert db.one("PRAGMA busy_timeout") == 5000
        assert db.one("PRAGMA foreign_keys") == 0


def test_a_transaction_commits_or_rolls_back_as_a_whole(tmp_path: Path) -> None:
    db = Database(str(tmp_path / "a.sqlite"))
    db.script("CREATE TABLE kv (key TEXT PRIMARY KEY, value INTEGER NOT NULL)")
    with db.transaction() as conn:
        conn.execute("INSERT INTO kv VALUES ('a', 1)")
        conn.execute("INSERT INTO kv VALUES ('b', 2)")
    with pytest.raises(sqlite3.IntegrityError):
        with db.transaction() as conn:
            conn.execute("INSERT INTO kv VALUES ('c', 3)")
            conn.execute("INSERT INTO kv VALUES ('a', 4)")  # the key exists: nothing of this block stays
    assert [tuple(row) for row in db.query("SELECT key, value FROM kv ORDER BY key")] == [("a", 1), ("b", 2)]
    db.close()
    with sqlite3.connect(str(tmp_path / "a.sqlite")) as other:  # committed for another connection too
        assert other.execute("SELECT SUM(value) FROM kv").fetchone()[0] == 3


def test_an_exclusive_file_is_refused_to_a_second_owner_with_the_callers_error(tmp_path: Path) -> None:
    path = str(tmp_path / "sub" / "t.sqlite")
    first = Database(path, name="task table", exclusive=True, error=OwnError, owner="coordinator")
    with pytest.raises(OwnError, match=rf"task table .*t\.sqlite.* another coordinator .*pid {os.getpid()}\b"):
        Database(path, name="task table", exclusive=True, error=OwnError, owner="coordinator")
    Database(path).close()  # a non-exclusive reader is not refused
    first.close()
    first.close()
    with Database(path, exclusive=True):  # the lock went with close()
        pass


def test_a_closed_database_refuses_calls(tmp_path: Path) -> None:
    db = Database(str(tmp_path / "a.sqlite"), name="league")
    db.close()
    assert db.closed
    with pytest.raises(DatabaseError, match=r"league .*a\.sqlite.* is closed"):
        db.one("SELECT 1")
