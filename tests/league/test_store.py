"""The league's stores: an SQLite league reopened keeps everything; an outcome is counted whole or not at all."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nervex.league import Change, League, MemoryStore, PairStats, Player, SQLiteStore

REPO_ROOT = Path(__file__).resolve().parents[2]
PLAYERS = [{"name": "main"}, {"name": "me", "kind": "main_exploiter"}, {"name": "le", "kind": "league_exploiter"}]
CFG = {"players": PLAYERS, "payoff": {"decay": 0.5, "min_games": 1}, "keep_history": 3}


def play_a_season(league: League) -> None:
    league.add_snapshot("main-now.pt", 30)
    league.freeze("main", "main-10.pt", 10)
    league.freeze("me", "me-10.pt", 10)
    league.record("main", "main@10", "win", key="e1")
    league.record("main", "me@10", "loss", key="e2")
    league.record("le", "main@10", "draw", key="e3")
    league.freeze("le", "le-20.pt", 20)


def snapshot_of(league: League):
    return league.store.players(), league.store.all_stats(), league.ratings(), league.to_rows()


def test_memory_and_sqlite_stores_hold_the_same_league(tmp_path):
    memory = League(MemoryStore(), CFG, rng=4)
    sqlite = League.open(str(tmp_path / "league.sqlite"), CFG, rng=4)
    for league in (memory, sqlite):
        play_a_season(league)
    strip = lambda players: [p.__class__(**{**p.__dict__, "created_at": 0.0}) for p in players]  # noqa: E731
    mem, sql = snapshot_of(memory), snapshot_of(sqlite)
    assert strip(mem[0]) == strip(sql[0]) and mem[1:] == sql[1:]
    sqlite.close()


def test_a_reopened_sqlite_league_keeps_every_player_snapshot_payoff_and_rating(tmp_path):
    path = str(tmp_path / "league.sqlite")
    league = League.open(path, CFG, rng=4)
    play_a_season(league)
    before = snapshot_of(league)
    league.close()
    reopened = League.open(path, CFG)
    assert snapshot_of(reopened) == before
    assert reopened.players() == ["main", "me", "le"]
    assert reopened.history() == ["main@10", "me@10", "le@20"]
    assert reopened.player("me@10") == Player("me@10", "historical", "me", "me-10.pt", 10, before[0][4].created_at)
    assert reopened.player("me").resets == 1 and reopened.current("main").name == "main-now.pt"
    # decay 0.5, one win: games 1, wins 1
    assert reopened.payoff.stats("main", "main@10") == PairStats(1.0, 1.0, 0.0, 0.0, 1)
    assert not reopened.record("main", "main@10", "win", key="e1")  # the keys survive too
    assert reopened.store.db.one("PRAGMA synchronous") == 2 and reopened.store.db.one("PRAGMA journal_mode") == "wal"
    reopened.close()
    reopened.close()


class FailingStore(SQLiteStore):
    """Writes a change, then fails before the commit (a crash inside the transaction)."""

    def _write(self, conn, change):
        super()._write(conn, change)
        raise OSError("disk gone")


def test_a_failed_transaction_changes_nothing(tmp_path):
    path = str(tmp_path / "league.sqlite")
    league = League.open(path, CFG)
    league.freeze("main", "s", 1)
    league.record("main", "main@1", "win", key="e1")
    league.close()
    failing = FailingStore(path)
    before = (failing.all_stats(), failing.ratings())
    with pytest.raises(OSError, match="disk gone"):
        League(failing, CFG).record("main", "main@1", "loss", key="e2")
    assert (failing.all_stats(), failing.ratings()) == before and not failing.applied("e2")
    failing.close()
    reopened = SQLiteStore(path)
    assert (reopened.all_stats(), reopened.ratings()) == before and not reopened.applied("e2")
    reopened.close()


RECORDER = """
import sys
from nervex.league import League
league = League.open(sys.argv[1], {"payoff": {"decay": 0.99, "min_games": 1}})
if not league.history():
    league.freeze("main", "s", 1)
i = 0
while True:
    league.record("main", "main@1", ("win", "loss", "draw")[i % 3], key=f"episode-{i}")
    i += 1
    if i == 30:
        print("recording", flush=True)
"""


def test_kill_9_mid_run_counts_every_outcome_once(tmp_path):
    """A recorder killed with SIGKILL at an arbitrary point: every key on disk has its game counted, no more."""
    path = str(tmp_path / "league.sqlite")
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", RECORDER, path], stdout=subprocess.PIPE, env=env, text=True)
    try:
        assert proc.stdout.readline().strip() == "recording"
        time.sleep(0.2)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    conn = sqlite3.connect(path)
    keys = {row[0] for row in conn.execute("SELECT key FROM outcome_keys")}
    conn.close()
    assert len(keys) >= 30 and keys == {f"episode-{i}" for i in range(len(keys))}
    store = SQLiteStore(path)
    n = len(keys)
    assert store.stats("main", "main@1").total == n and store.stats("main@1", "main").total == n
    # undecayed counts of the sequence win, loss, draw, win... : wins ceil(n/3), losses and draws the rest
    stats = store.stats("main", "main@1")
    wins = sum(0.99 ** (n - 1 - i) for i in range(0, n, 3))
    assert stats.wins == pytest.approx(wins, rel=1e-9)
    assert stats.games == pytest.approx(sum(0.99**j for j in range(n)), rel=1e-9)
    ratings = store.ratings()
    assert ratings["main"] + ratings["main@1"] == pytest.approx(2400.0)  # Elo moves points, never makes them
    store.close()


def test_a_first_league_file_is_upgraded(tmp_path):
    """A league.sqlite of the one-player league (players, snapshots tables) opens, its players kept."""
    path = str(tmp_path / "league.sqlite")
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE players (player_id TEXT PRIMARY KEY, kind TEXT NOT NULL, created_at REAL NOT NULL)")
    conn.execute("INSERT INTO players VALUES ('main', 'main', 5.0)")
    conn.commit()
    conn.close()
    league = League.open(path)
    assert league.player("main") == Player("main", "main", None, None, 0, 5.0, 0, 0)
    league.freeze("main", "s", 3)
    league.close()
    assert League.open(path).history() == ["main@3"]


def test_store_change_order_and_keys():
    store = MemoryStore()
    store.apply(Change(players=(Player("a", "main"), Player("b", "main"))))
    store.apply(Change(stats={("a", "b"): PairStats(1, 1, 0, 0, 1)}, ratings={"a": 1300}, key="k"))
    assert not store.apply(Change(players=(Player("c", "main"),), key="k"))  # refused whole
    assert [p.player_id for p in store.players()] == ["a", "b"]
    store.apply(Change(players=(Player("a", "main", step=7),)))  # replaced in place
    assert [(p.player_id, p.step) for p in store.players()] == [("a", 7), ("b", 0)]
    store.apply(Change(removed=("b",)))
    assert store.all_stats() == {} and store.ratings() == {"a": 1300.0}
