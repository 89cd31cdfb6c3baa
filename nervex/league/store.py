"""Where a league keeps its state: players, payoff statistics, applied-outcome keys and ratings.

``MemoryStore`` serves serial runs; ``SQLiteStore`` (a ``nervex.utils.sqlite.Database``: WAL, ``synchronous=FULL``)
serves the parallel league manager and any run that must survive a ``kill -9``. Every change goes through
``apply(Change)``, one transaction: an outcome's payoff rows, its key and both ratings are written together or not at
all, so an outcome is never counted half or twice. ``SQLiteStore`` keeps players, payoff rows and ratings in memory
too (it is their only writer), so reads cost no query; the applied keys stay on disk only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Protocol, Tuple

from nervex.utils.sqlite import Database

from .player import Player


@dataclass(frozen=True)
class PairStats:
    """Payoff statistics of ``home`` against ``away`` (decayed counts; ``total`` is the undecayed game count)."""

    games: float = 0.0
    wins: float = 0.0
    draws: float = 0.0
    losses: float = 0.0
    total: int = 0


Pair = Tuple[str, str]


@dataclass(frozen=True)
class Change:
    """One atomic change of a store, applied in this order: ``removed`` (players with their payoff rows and
    ratings), ``cleared`` (payoff rows of players whose parameters were reset, both directions), ``players``
    (inserted or replaced; a replaced player keeps its place in the order), ``stats`` (payoff rows set), ``ratings``
    (set), ``key`` (remembered: a later change with the same key is refused)."""

    players: Tuple[Player, ...] = ()
    removed: Tuple[str, ...] = ()
    cleared: Tuple[str, ...] = ()
    stats: Mapping[Pair, PairStats] = field(default_factory=dict)
    ratings: Mapping[str, float] = field(default_factory=dict)
    key: Optional[str] = None


class MemoryStore:
    """A league's state in memory (serial runs, tests)."""

    def __init__(self) -> None:
        self._players: Dict[str, Player] = {}
        self._stats: Dict[Pair, PairStats] = {}
        self._ratings: Dict[str, float] = {}
        self._keys: set = set()

    def players(self) -> List[Player]:
        """Every player, active and historical, in the order they entered."""
        return list(self._players.values())

    def stats(self, home: str, away: str) -> PairStats:
        """The payoff statistics of ``home`` against ``away`` (zeros when they never played)."""
        return self._stats.get((home, away), PairStats())

    def all_stats(self) -> Dict[Pair, PairStats]:
        """Every stored payoff row, ``(home, away) -> PairStats``."""
        return dict(self._stats)

    def ratings(self) -> Dict[str, float]:
        """Every stored rating (players never rated are absent)."""
        return dict(self._ratings)

    def applied(self, key: str) -> bool:
        """Whether a change with this key was applied."""
        return key in self._keys

    def apply(self, change: Change) -> bool:
        """Apply ``change`` atomically.

        Returns:
            False (and nothing changed) when ``change.key`` was applied before; True otherwise.
        """
        if change.key is not None and self.applied(change.key):
            return False
        self._apply_in_memory(change)
        return True

    def _apply_in_memory(self, change: Change) -> None:
        gone = set(change.removed) | set(change.cleared)
        if gone:
            self._stats = {pair: s for pair, s in self._stats.items() if pair[0] not in gone and pair[1] not in gone}
        for player_id in change.removed:
            self._players.pop(player_id, None)
            self._ratings.pop(player_id, None)
        for player in change.players:
            self._players[player.player_id] = player
        self._stats.update(change.stats)
        self._ratings.update({k: float(v) for k, v in change.ratings.items()})
        if change.key is not None:
            self._remember(change.key)

    def _remember(self, key: str) -> None:
        self._keys.add(key)

    def close(self) -> None:
        """Nothing to release (kept for the common interface)."""


_SCHEMA = """
CREATE TABLE IF NOT EXISTS players (player_id TEXT PRIMARY KEY, kind TEXT NOT NULL, created_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS payoff (
    home TEXT NOT NULL, away TEXT NOT NULL, games REAL NOT NULL, wins REAL NOT NULL, draws REAL NOT NULL,
    losses REAL NOT NULL, total INTEGER NOT NULL, PRIMARY KEY (home, away)
);
CREATE TABLE IF NOT EXISTS outcome_keys (key TEXT PRIMARY KEY);
CREATE TABLE IF NOT EXISTS ratings (player_id TEXT PRIMARY KEY, rating REAL NOT NULL);
"""
# columns added to the first league's ``players`` table (player_id, kind, created_at): an older file is upgraded
_PLAYER_COLUMNS = {
    "parent": "TEXT",
    "snapshot": "TEXT",
    "step": "INTEGER NOT NULL DEFAULT 0",
    "last_frozen_step": "INTEGER NOT NULL DEFAULT 0",
    "resets": "INTEGER NOT NULL DEFAULT 0",
}
_PLAYER_FIELDS = ("player_id", "kind", "parent", "snapshot", "step", "created_at", "last_frozen_step", "resets")


class SQLiteStore(MemoryStore):
    """A league's state in one SQLite file (WAL, ``synchronous=FULL``): every ``apply`` is one fsynced
    transaction, and reopening the file gives back every player, payoff row and rating.

    Args:
        path: The SQLite file (node-local disk).
    """

    def __init__(self, path: str) -> None:
        super().__init__()
        self.db = Database(path, name="league")
        try:
            self.db.script(_SCHEMA)
            self._upgrade_players_table()
            self._load()
        except BaseException:
            self.db.close()
            raise

    def _upgrade_players_table(self) -> None:
        have = {row[1] for row in self.db.query("PRAGMA table_info(players)")}
        for name, decl in _PLAYER_COLUMNS.items():
            if name not in have:
                self.db.execute(f"ALTER TABLE players ADD COLUMN {name} {decl}")

    def _load(self) -> None:
        columns = ", ".join(_PLAYER_FIELDS)
        for row in self.db.query(f"SELECT {columns} FROM players ORDER BY rowid"):
            values = dict(zip(_PLAYER_FIELDS, tuple(row)))
            for name in ("step", "last_frozen_step", "resets"):
                values[name] = int(values[name])
            values["created_at"] = float(values["created_at"])
            self._players[values["player_id"]] = Player(**values)
        for row in self.db.query("SELECT home, away, games, wins, draws, losses, total FROM payoff"):
            self._stats[(row[0], row[1])] = PairStats(*(float(v) for v in tuple(row)[2:6]), int(row[6]))
        self._ratings = {row[0]: float(row[1]) for row in self.db.query("SELECT player_id, rating FROM ratings")}

    def applied(self, key: str) -> bool:
        return self.db.one("SELECT 1 FROM outcome_keys WHERE key=?", (key,)) is not None

    def apply(self, change: Change) -> bool:
        with self.db.transaction() as conn:
            if change.key is not None:
                if conn.execute("SELECT 1 FROM outcome_keys WHERE key=?", (change.key,)).fetchone() is not None:
                    return False
                conn.execute("INSERT INTO outcome_keys VALUES (?)", (change.key,))
            self._write(conn, change)
        self._apply_in_memory(change)
        return True

    @staticmethod
    def _write(conn, change: Change) -> None:
        for player_id in (*change.removed, *change.cleared):
            conn.execute("DELETE FROM payoff WHERE home=? OR away=?", (player_id, player_id))
        for player_id in change.removed:
            conn.execute("DELETE FROM players WHERE player_id=?", (player_id,))
            conn.execute("DELETE FROM ratings WHERE player_id=?", (player_id,))
        updates = ", ".join(f"{name}=excluded.{name}" for name in _PLAYER_FIELDS[1:])
        for p in change.players:
            conn.execute(
                f"INSERT INTO players ({', '.join(_PLAYER_FIELDS)}) VALUES (?, ?, ?, ?, ?, ?, ?, ?) "
                f"ON CONFLICT(player_id) DO UPDATE SET {updates}",
                (p.player_id, p.kind, p.parent, p.snapshot, p.step, p.created_at, p.last_frozen_step,
                 p.resets),
            )  # fmt: skip
        for (home, away), s in change.stats.items():
            conn.execute(
                "INSERT OR REPLACE INTO payoff VALUES (?, ?, ?, ?, ?, ?, ?)",
                (home, away, s.games, s.wins, s.draws, s.losses, s.total),
            )
        for player_id, rating in change.ratings.items():
            conn.execute("INSERT OR REPLACE INTO ratings VALUES (?, ?)", (player_id, float(rating)))

    def _remember(self, key: str) -> None:
        pass  # the key is on disk; keeping every outcome's key in memory too would grow without bound

    def close(self) -> None:
        """Close the file; safe to call twice."""
        self.db.close()


class LeagueStore(Protocol):
    """The interface of a league's store (``MemoryStore``; ``SQLiteStore`` is one written through to SQLite)."""

    def players(self) -> List[Player]: ...

    def stats(self, home: str, away: str) -> PairStats: ...

    def all_stats(self) -> Dict[Pair, PairStats]: ...

    def ratings(self) -> Dict[str, float]: ...

    def applied(self, key: str) -> bool: ...

    def apply(self, change: Change) -> bool: ...

    def close(self) -> None: ...


__all__ = ["Change", "LeagueStore", "MemoryStore", "PairStats", "SQLiteStore"]
