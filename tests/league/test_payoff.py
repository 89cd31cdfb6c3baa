"""Payoff arithmetic (decay, draws, min_games, both directions, idempotent keys) and Elo, by hand."""

from __future__ import annotations

import pytest

from nervex.league import Elo, MemoryStore, PairStats, Payoff, SQLiteStore


@pytest.fixture(params=["memory", "sqlite"])
def store(request, tmp_path):
    s = MemoryStore() if request.param == "memory" else SQLiteStore(str(tmp_path / "payoff.sqlite"))
    yield s
    s.close()


def test_decay_half_win_loss_draw_by_hand(store):
    payoff = Payoff(store, decay=0.5, min_games=1)
    assert payoff.update("a", "b", "win")
    assert payoff.stats("a", "b") == PairStats(games=1.0, wins=1.0, draws=0.0, losses=0.0, total=1)
    assert payoff.update("a", "b", -1)
    # every count halves before the game is added: games 1*.5+1, wins 1*.5, losses 0*.5+1
    assert payoff.stats("a", "b") == PairStats(games=1.5, wins=0.5, draws=0.0, losses=1.0, total=2)
    assert payoff.update("a", "b", "draw")
    assert payoff.stats("a", "b") == PairStats(games=1.75, wins=0.25, draws=1.0, losses=0.5, total=3)
    # b's side mirrors it: loss, win, draw
    assert payoff.stats("b", "a") == PairStats(games=1.75, wins=0.5, draws=1.0, losses=0.25, total=3)
    # draws count half: (.25 + .5) / 1.75 = 3/7 and (.5 + .5) / 1.75 = 4/7
    assert payoff.win_rate("a", "b") == pytest.approx(3 / 7, abs=1e-12)
    assert payoff.win_rate("b", "a") == pytest.approx(4 / 7, abs=1e-12)


def test_win_rate_is_one_half_below_min_games(store):
    payoff = Payoff(store, decay=0.5, min_games=1.8)
    for result in ("win", "win", "win"):
        payoff.update("a", "b", result)
    # games = 1.75 (1, 1.5, 1.75) < 1.8: not enough to judge
    assert payoff.stats("a", "b").games == 1.75 and payoff.win_rate("a", "b") == 0.5
    payoff.update("a", "b", "win")  # games = 1.875
    assert payoff.win_rate("a", "b") == 1.0
    assert payoff.win_rate("a", "never_played") == 0.5


def test_no_decay_counts_games_and_tables(store):
    payoff = Payoff(store, decay=1.0, min_games=2)
    for result in ("win", "win", "loss", "draw"):
        payoff.update("a", "b", result)
    payoff.update("c", "a", "win")
    assert payoff.stats("a", "b") == PairStats(games=4.0, wins=2.0, draws=1.0, losses=1.0, total=4)
    assert payoff.win_rate("a", "b") == 2.5 / 4
    # a against [b, c]: 0.625 and 0.5 (one game with c is below min_games=2)
    assert payoff.win_rates("a", ["b", "c"]).tolist() == [0.625, 0.5]
    assert payoff.table(["a", "b"]).tolist() == [[0.5, 0.625], [0.375, 0.5]]


def test_an_update_with_a_known_key_counts_nothing(store):
    payoff = Payoff(store, decay=0.99, min_games=0)
    assert payoff.update("a", "b", 1, key="episode-7") is True
    assert payoff.update("a", "b", 1, key="episode-7") is False
    assert payoff.update("b", "a", -1, key="episode-7") is False
    assert payoff.stats("a", "b") == PairStats(1.0, 1.0, 0.0, 0.0, 1)
    assert payoff.update("a", "b", 1, key="episode-8") is True
    assert payoff.stats("a", "b").total == 2 and payoff.stats("a", "b").wins == pytest.approx(1.99)


def test_bad_results_and_settings_are_refused(store):
    payoff = Payoff(store)
    for bad in ("won", 0.5, 2, True, None):
        with pytest.raises(ValueError, match="result"):
            payoff.update("a", "b", bad)
    with pytest.raises(ValueError, match="itself"):
        payoff.update("a", "a", 1)
    with pytest.raises(ValueError, match=r"decay must lie in \(0, 1\]"):
        Payoff(store, decay=1.5)
    with pytest.raises(ValueError, match="never reached"):
        Payoff(store, decay=0.5, min_games=2)  # decayed games stay below 1 / (1 - 0.5) = 2
    assert store.all_stats() == {}


def test_elo_of_two_games_by_hand():
    elo = Elo(k=16, initial=1200)
    # game 1, equal ratings: expected 0.5, a wins: a += 16 * 0.5
    a, b = elo.update(1200.0, 1200.0, 1.0)
    assert (a, b) == (1208.0, 1192.0)
    # game 2, a draw: a's expected score 1 / (1 + 10^((1192 - 1208) / 400)) = 1 / (1 + 0.9120108) = 0.5230096
    a, b = elo.update(a, b, 0.5)
    assert a == pytest.approx(1208.0 + 16 * (0.5 - 0.5230096), abs=1e-5)  # 1207.63185
    assert b == pytest.approx(1192.0 - 16 * (0.5 - 0.5230096), abs=1e-5)
    with pytest.raises(ValueError, match="k must lie"):
        Elo(k=0)


def test_league_record_updates_payoff_and_elo_together(make_league):
    league = make_league({"payoff": {"decay": 0.5, "min_games": 1}})
    league.freeze("main", "s0", 10)
    assert league.record("main", "main@10", "win", key="e1")
    assert league.record("main", "main@10", 0, key="e2")
    assert not league.record("main", "main@10", 0, key="e2")  # counted once
    assert not league.record("main", "main", 1, key="e3")  # self-play tells the table nothing
    ratings = league.ratings()
    assert ratings["main"] == pytest.approx(1207.63185, abs=1e-4)
    assert ratings["main@10"] == pytest.approx(1192.36815, abs=1e-4)
    # win then draw at decay 0.5: games 1.5, wins 0.5, draws 1 -> (0.5 + 0.5) / 1.5
    assert league.payoff.win_rate("main", "main@10") == pytest.approx(2 / 3)
    assert league.to_rows() == [
        dict(home="main", away="main@10", games=1.5, wins=0.5, draws=1.0, losses=0.0, win_rate=pytest.approx(2 / 3)),
        dict(home="main@10", away="main", games=1.5, wins=0.0, draws=1.0, losses=0.5, win_rate=pytest.approx(1 / 3)),
    ]
    ids, table = league.payoff_table()
    assert ids == ["main", "main@10"]
    assert table.tolist() == [[0.5, pytest.approx(2 / 3)], [pytest.approx(1 / 3), 0.5]]
    with pytest.raises(KeyError, match="no player 'ghost'"):
        league.record("main", "ghost", 1)
