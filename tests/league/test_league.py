"""Tests of the league's SQLite store: snapshots, history and what it chooses, kept across a reopen."""

from __future__ import annotations

from pathlib import Path

from nervex.league.league import MAIN_PLAYER, League, Snapshot

LEGACY = {"matchmaking": "self_play", "keep_history": 2, "snapshot": {"every_steps": 10}}  # as the league manager


def test_snapshots_history_and_choice_survive_a_reopen(tmp_path: Path) -> None:
    path = str(tmp_path / "league.sqlite")
    league = League.open(path, LEGACY)
    assert league.players() == [MAIN_PLAYER] and league.task_choice() is None
    for name, policy_iter in (("s0", 0), ("s5", 5), ("s12", 12), ("s25", 25)):
        history = league.wants_history(policy_iter)
        league.add_snapshot(name, policy_iter, history=history)
    assert [league.player(h).snapshot for h in league.history()] == [
        "s0",
        "s12",
        "s25",
    ]  # s5 came 5 steps after s0: not history
    assert league.forget_old_history() == ["s0"]
    league.close()
    league.close()
    reopened = League.open(path, LEGACY)
    assert reopened.players() == [MAIN_PLAYER]
    assert reopened.current() == Snapshot("s25", MAIN_PLAYER, 25, True)
    assert [reopened.player(h).snapshot for h in reopened.history()] == ["s12", "s25"]
    reopened.add_snapshot("s30", 30)  # not history: the newest non-history snapshot replaces the older ones
    assert reopened.task_choice() == {"player": MAIN_PLAYER, "snapshot": "s30", "policy_iter": 30, "opponent": None}
    assert reopened.store.db.one("PRAGMA synchronous") == 2
    reopened.close()
