"""The league: players and their policy snapshots, durable in SQLite, and the choice of what each collect task plays.

Today a league has one main player trained by the learner; every snapshot the learner publishes becomes the main
player's current policy, and every ``history_every`` gradient steps one is copied into the league's history (kind
``league`` on the storage path, so the learner's snapshot clean-up never deletes it). ``choose`` returns the snapshot
collect tasks act with and an opponent: None for one player. The self-play league (payoff table, PFSP over the
history) replaces ``choose_opponent`` and adds players; the tables already hold what it needs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import List, Optional

from nervex.utils.sqlite import Database

_SCHEMA = """
CREATE TABLE IF NOT EXISTS players (player_id TEXT PRIMARY KEY, kind TEXT NOT NULL, created_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS snapshots (
    name TEXT NOT NULL, player_id TEXT NOT NULL, policy_iter INTEGER NOT NULL, created_at REAL NOT NULL,
    history INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (player_id, name)
);
CREATE INDEX IF NOT EXISTS snapshots_by_iter ON snapshots (player_id, policy_iter);
"""
MAIN_PLAYER = "main"


@dataclass(frozen=True)
class Snapshot:
    """One policy snapshot of a player: its storage name and the learner iteration it was taken at."""

    name: str
    player_id: str
    policy_iter: int
    history: bool


class League:
    """Players and snapshots in ``<run_dir>/league.sqlite`` (a ``nervex.utils.sqlite.Database``: WAL,
    ``synchronous=FULL``).

    Args:
        path: The SQLite file.
        keep_history: History snapshots kept per player (the oldest are forgotten; ``forget`` returns them so the
            caller deletes their files).
        history_every: Gradient steps between two history snapshots of a player.
    """

    def __init__(self, path: str, keep_history: int = 32, history_every: int = 1000) -> None:
        self.keep_history = int(keep_history)
        self.history_every = int(history_every)
        self._db = Database(path, name="league")
        self._db.script(_SCHEMA)
        self.add_player(MAIN_PLAYER, "main")

    def close(self) -> None:
        """Close the database; safe to call twice."""
        self._db.close()

    def add_player(self, player_id: str, kind: str) -> None:
        """Add a player (idempotent)."""
        self._db.execute("INSERT OR IGNORE INTO players VALUES (?, ?, ?)", (player_id, kind, time.time()))

    def players(self) -> List[str]:
        """Every player's id, oldest first."""
        return [row[0] for row in self._db.query("SELECT player_id FROM players ORDER BY created_at")]

    def current(self, player_id: str = MAIN_PLAYER) -> Optional[Snapshot]:
        """The player's newest snapshot, or None before the first."""
        rows = self._db.query(
            "SELECT name, player_id, policy_iter, history FROM snapshots WHERE player_id=? "
            "ORDER BY policy_iter DESC, created_at DESC LIMIT 1",
            (player_id,),
        )
        return None if not rows else Snapshot(rows[0][0], rows[0][1], int(rows[0][2]), bool(rows[0][3]))

    def history(self, player_id: str = MAIN_PLAYER) -> List[Snapshot]:
        """The player's history snapshots, oldest first."""
        rows = self._db.query(
            "SELECT name, player_id, policy_iter, history FROM snapshots WHERE player_id=? AND history=1 "
            "ORDER BY policy_iter",
            (player_id,),
        )
        return [Snapshot(r[0], r[1], int(r[2]), True) for r in rows]

    def wants_history(self, policy_iter: int, player_id: str = MAIN_PLAYER) -> bool:
        """Whether a snapshot taken at ``policy_iter`` should be kept as history (``history_every`` since the last)."""
        past = self.history(player_id)
        return not past or policy_iter - past[-1].policy_iter >= self.history_every

    def add_snapshot(self, name: str, policy_iter: int, player_id: str = MAIN_PLAYER, history: bool = False) -> None:
        """Record a snapshot (the player's current one; ``history``: kept as a future opponent). Non-history
        snapshots other than the newest are forgotten (the learner deletes their files)."""
        with self._db.transaction() as conn:
            conn.execute(
                "INSERT OR REPLACE INTO snapshots VALUES (?, ?, ?, ?, ?)",
                (name, player_id, int(policy_iter), time.time(), int(history)),
            )
            conn.execute("DELETE FROM snapshots WHERE player_id=? AND history=0 AND name<>?", (player_id, name))

    def forget_old_history(self, player_id: str = MAIN_PLAYER) -> List[str]:
        """Drop history snapshots beyond ``keep_history``; returns their names (delete the files)."""
        past = self.history(player_id)
        old = past[: max(0, len(past) - self.keep_history)]
        with self._db.transaction() as conn:
            for snap in old:
                conn.execute("DELETE FROM snapshots WHERE player_id=? AND name=?", (player_id, snap.name))
        return [snap.name for snap in old]

    def choose_opponent(self, player_id: str = MAIN_PLAYER) -> Optional[Snapshot]:
        """The opponent of the player's next collect task: None with one player (the self-play seam)."""
        return None

    def choose(self, player_id: str = MAIN_PLAYER) -> Optional[dict]:
        """The choice posted to the coordinator: ``{player, snapshot, policy_iter, opponent}``, None before any."""
        current = self.current(player_id)
        if current is None:
            return None
        opponent = self.choose_opponent(player_id)
        return {
            "player": player_id,
            "snapshot": current.name,
            "policy_iter": current.policy_iter,
            "opponent": None if opponent is None else opponent.name,
        }


__all__ = ["League", "MAIN_PLAYER", "Snapshot"]
