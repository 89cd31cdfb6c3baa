"""One SQLite file opened for durability: the connection set-up every durable table of nervex shares.

The coordinator's task table and run state and the league manager's league each keep their state in SQLite on
node-local disk. They open it the same way, here:

* WAL journal with ``synchronous=FULL``: a transaction is fsynced to the WAL before ``COMMIT`` returns, so what a caller
  acknowledged survives a ``kill -9`` and a power loss of its node (``NORMAL`` would survive the ``kill -9`` only);
* or, with ``group_commit``, group commit: ``synchronous=NORMAL`` (``COMMIT`` writes the WAL, no fsync, so the lock is
  held for microseconds, not for a disk flush) and ``sync()``, which a caller calls before it acknowledges anything:
  one fsync of the WAL makes every transaction committed so far durable, and callers that arrive while one runs share
  the next. The server answers only after ``sync()``, so what it acknowledged survives a power loss as with ``FULL``;
  a flush serves every request that waited for it instead of one;
* a busy timeout, for the readers of another process (``sqlite3`` on the command line while a run goes on);
* one connection shared by the threads of the process, behind one re-entrant lock;
* write transactions that take the write lock up front (``BEGIN IMMEDIATE``), so a read-then-update is atomic;
* optionally an exclusive ``flock`` on ``<path>.lock`` holding the owner's pid, so a second owner of the file, in this
  process or another, is refused while the first is alive (the OS drops the lock when the process dies, ``kill -9``
  included, so a crashed owner never blocks its successor).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sqlite3
import threading
from typing import Any, Iterable, Iterator, List, Optional, Type

BUSY_TIMEOUT_MS = 5000
"""How long a statement waits for another connection's lock before SQLite reports "database is locked"."""


class DatabaseError(RuntimeError):
    """A durable SQLite file cannot be used: held by another owner, refuses WAL, or closed."""


class Database:
    """One SQLite file, WAL with ``synchronous=FULL``, a busy timeout, one connection behind a lock.

    Example::

        db = Database("run/league.sqlite", name="league")
        db.script("CREATE TABLE IF NOT EXISTS kv (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        with db.transaction() as conn:
            conn.execute("INSERT OR REPLACE INTO kv VALUES (?, ?)", ("a", "1"))
        db.one("SELECT value FROM kv WHERE key=?", ("a",))   # '1'

    Args:
        path: The SQLite file, on node-local disk (WAL does not work on network file systems).
        name: What the file holds, for error messages (``'task table'``, ``'league'``).
        exclusive: Hold an exclusive ``flock`` on ``<path>.lock`` while open; a second exclusive open is refused.
        foreign_keys: Enforce ``REFERENCES`` clauses.
        error: The exception raised when the file cannot be used (a subclass of ``DatabaseError`` or another
            ``Exception`` the caller's users already catch).
        owner: Who holds the file, for the message of a refused exclusive open (``'coordinator'``).
        group_commit: ``synchronous=NORMAL`` and ``sync()`` flushes (see the module's text); False: every commit is
            flushed before it returns and ``sync()`` does nothing.

    Raises:
        error: the file is held by another exclusive owner, or refuses WAL.
    """

    def __init__(
        self,
        path: str,
        name: str = "database",
        exclusive: bool = False,
        foreign_keys: bool = False,
        error: Type[Exception] = DatabaseError,
        owner: str = "process",
        group_commit: bool = False,
    ) -> None:
        self.path = os.path.abspath(path)
        self.name = name
        self._error = error
        self.lock = threading.RLock()
        """Held by every call; hold it around several calls that must see one state."""
        self.group_commit = bool(group_commit)
        self._sync_lock = threading.Lock()  # one flush at a time; the callers behind it share the next
        self._commits = 0  # write statements and transactions committed (under ``lock``)
        self._synced = 0  # of those, the ones a flush has made durable
        self._wal_fd: Optional[int] = None  # the WAL file, opened at the first flush
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        self._lock_fd: Optional[int] = _acquire_lock_file(self.path, name, owner, error) if exclusive else None
        self._conn: Optional[sqlite3.Connection] = None
        try:
            self._conn = self._connect(foreign_keys)
        except BaseException:
            self.close()
            raise

    def _connect(self, foreign_keys: bool) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=BUSY_TIMEOUT_MS / 1000)
        conn.row_factory = sqlite3.Row
        mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if mode.lower() != "wal":
            conn.close()
            raise self._error(f"{self.name} {self.path!r} refused journal_mode=WAL (got {mode!r}); use local disk")
        conn.execute(f"PRAGMA synchronous={'NORMAL' if self.group_commit else 'FULL'}")
        conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        if foreign_keys:
            conn.execute("PRAGMA foreign_keys=ON")
        return conn

    def close(self) -> None:
        """Close the connection and release the lock file; safe to call twice."""
        with self.lock:
            conn, self._conn = self._conn, None
            if conn is not None:
                conn.close()
            fd, self._lock_fd = self._lock_fd, None
            if fd is not None:
                _release_lock_file(fd)
            wal, self._wal_fd = self._wal_fd, None
            if wal is not None:
                os.close(wal)

    @property
    def closed(self) -> bool:
        """Whether ``close`` was called."""
        return self._conn is None

    def connection(self) -> sqlite3.Connection:
        """The open connection (hold ``lock`` while using it).

        Raises:
            error: the database is closed.
        """
        if self._conn is None:
            raise self._error(f"{self.name} {self.path!r} is closed")
        return self._conn

    @contextlib.contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One write transaction: ``BEGIN IMMEDIATE`` ... ``COMMIT``, or ``ROLLBACK`` when the block raises."""
        with self.lock:
            conn = self.connection()
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
            self._commits += 1

    def execute(self, sql: str, params: Iterable[Any] = ()) -> None:
        """Run one statement in its own (autocommitted) transaction."""
        with self.lock:
            self.connection().execute(sql, tuple(params))
            self._commits += 1

    def script(self, sql: str) -> None:
        """Run several statements separated by ``;`` (a schema), each autocommitted."""
        with self.lock:
            self.connection().executescript(sql)
            self._commits += 1

    @property
    def unsynced(self) -> int:
        """Commits not yet made durable by ``sync`` (always 0 without ``group_commit``)."""
        return self._commits - self._synced if self.group_commit else 0

    def sync(self) -> None:
        """With ``group_commit``: make every transaction committed so far durable (one fsync of the WAL, shared by
        the callers that wait for it meanwhile); call it before acknowledging what they did. Without: nothing to do.

        Raises:
            OSError: the flush failed (the disk reported an error): nothing may be acknowledged.
        """
        if not self.group_commit or self._synced >= self._commits:
            return
        with self._sync_lock:
            upto = self._commits  # every commit counted so far has written its WAL frames
            if self._synced >= upto:
                return  # the flush this caller waited behind covered it
            self._flush_wal()
            self._synced = upto

    def _flush_wal(self) -> None:
        if self._wal_fd is None:
            try:  # SQLite keeps this file (truncating it in place) while its connection is open
                self._wal_fd = os.open(self.path + "-wal", os.O_RDONLY)
            except FileNotFoundError:
                return  # nothing written yet: nothing to flush
            _fsync_directory(os.path.dirname(self.path))  # the WAL's directory entry must survive too
        os.fsync(self._wal_fd)

    def query(self, sql: str, params: Iterable[Any] = ()) -> List[sqlite3.Row]:
        """Every row ``sql`` selects."""
        with self.lock:
            return self.connection().execute(sql, tuple(params)).fetchall()

    def one(self, sql: str, params: Iterable[Any] = ()) -> Any:
        """The first column of the first row ``sql`` selects; None when it selects none."""
        rows = self.query(sql, params)
        return rows[0][0] if rows else None

    def __enter__(self) -> Database:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()


def _fsync_directory(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _acquire_lock_file(db_path: str, name: str, owner: str, error: Type[Exception]) -> int:
    """Take an exclusive ``flock`` on ``<db_path>.lock`` and write this pid into it.

    Raises:
        error: another process (or another open ``Database`` in this one) holds the lock.
    """
    lock_path = db_path + ".lock"
    os.makedirs(os.path.dirname(lock_path), exist_ok=True)
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip() or "unknown"
        os.close(fd)
        raise error(
            f"{name} {db_path!r} is already open by another {owner} (lock file {lock_path!r} held by pid "
            f"{holder}); stop it or point this one at another database"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
    return fd


def _release_lock_file(fd: int) -> None:
    os.ftruncate(fd, 0)
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)


__all__ = ["BUSY_TIMEOUT_MS", "Database", "DatabaseError"]
