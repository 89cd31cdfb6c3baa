"""Matchmaking shares over many seeded draws (within 4.5 binomial sigmas), snapshot rules, resets, keep_history."""

from __future__ import annotations

import math
from collections import Counter
from typing import Dict, Tuple

import numpy as np
import pytest

from nervex.league import League, MemoryStore
from nervex.league.matchmaking import remove_monotonic_suffix

EXACT = {"payoff": {"decay": 1.0, "min_games": 1}}  # no decay: a win rate is wins / games after the first game


def set_record(league: League, home: str, away: str, wins: int, losses: int) -> None:
    for _ in range(wins):
        league.record(home, away, "win")
    for _ in range(losses):
        league.record(home, away, "loss")


def draw(league: League, player: str, n: int, seed: int = 0) -> Counter:
    rng = np.random.default_rng(seed)
    counts: Counter = Counter()
    for _ in range(n):
        match = league.choose(player, rng)
        counts[(match.kind, match.opponent)] += 1
    return counts


def assert_shares(counts: Counter, n: int, expected: Dict[Tuple[str, str], float]) -> None:
    assert set(counts) == {k for k, p in expected.items() if p > 0}, counts
    assert sum(expected.values()) == pytest.approx(1.0)
    for key, p in expected.items():
        sigma = math.sqrt(n * p * (1 - p))
        assert abs(counts[key] - n * p) <= 4.5 * sigma + 1e-9, (key, counts[key], n * p, sigma)


def league_with_history(make_league, cfg: dict, exploiter: str = "main_exploiter") -> League:
    players = [{"name": "main", "kind": "main"}, {"name": "x", "kind": exploiter}]
    league = make_league({**EXACT, **cfg, "players": players})
    league.freeze("main", "main-1.pt", 1)
    league.freeze("main", "main-2.pt", 2)
    league.freeze("x", "x-1.pt", 1, rng=np.random.default_rng(0))
    return league


def test_no_history_means_self_play_for_every_kind(make_league):
    players = [{"name": "main"}, {"name": "me", "kind": "main_exploiter"}, {"name": "le", "kind": "league_exploiter"}]
    league = make_league({"players": players})
    for name in ("main", "le"):
        assert league.choose(name).kind == "self_play" and league.choose(name).opponent == name
    assert league.choose("main").opponent_snapshot is None
    # a main exploiter always has a target: the main player's current parameters
    assert (league.choose("me").kind, league.choose("me").opponent) == ("exploit", "main")


def test_alphastar_mix_shares(make_league):
    league = league_with_history(make_league, {"matchmaking": "alphastar"})
    set_record(league, "main", "main@1", 3, 1)  # 0.75
    set_record(league, "main", "main@2", 1, 1)  # 0.5
    set_record(league, "main", "x@1", 1, 4)  # 0.2: the exploiter's snapshot still beats main: verification plays it
    n = 20_000
    squared = {"main@1": 0.25**2, "main@2": 0.5**2, "x@1": 0.8**2}  # (1 - x)^2, summing to 0.9525
    total = sum(squared.values())
    expected = {("pfsp", k): 0.5 * w / total for k, w in squared.items()}
    expected[("self_play", "main")] = 0.35
    expected[("verification", "x@1")] = 0.15
    assert_shares(draw(league, "main", n), n, expected)
    match = league.choose("main", np.random.default_rng(3))
    assert (
        match.opponent_snapshot
        == {"main": None, "main@1": "main-1.pt", "main@2": "main-2.pt", "x@1": "x-1.pt"}[match.opponent]
    )


def test_verification_replays_forgotten_history_then_falls_back_to_self_play(make_league):
    league = make_league({**EXACT, "main_mix": {"pfsp": 0.5, "self_play": 0.35, "verification": 0.15}})
    league.freeze("main", "a", 1)
    league.freeze("main", "b", 2)
    set_record(league, "main", "main@1", 3, 2)  # 0.6
    set_record(league, "main", "main@2", 4, 1)  # 0.8: rising toward the newest, below 0.7 once: replay both
    # squared: (0.4^2, 0.2^2) = (0.16, 0.04) -> (0.8, 0.2), for the PFSP share and the verification share alike
    n = 20_000
    expected = {
        ("pfsp", "main@1"): 0.5 * 0.8,
        ("pfsp", "main@2"): 0.5 * 0.2,
        ("self_play", "main"): 0.35,
        ("verification", "main@1"): 0.15 * 0.8,
        ("verification", "main@2"): 0.15 * 0.2,
    }
    assert_shares(draw(league, "main", n), n, expected)
    set_record(league, "main", "main@2", 0, 3)  # 4 / 8 = 0.5: falling toward the newest: nothing forgotten
    expected = {("pfsp", "main@1"): 0.5 * 0.16 / 0.41, ("pfsp", "main@2"): 0.5 * 0.25 / 0.41}
    expected[("self_play", "main")] = 0.5  # verification found no candidate: self-play
    assert_shares(draw(league, "main", 4000), 4000, expected)


def test_remove_monotonic_suffix_by_hand():
    rates, kept = remove_monotonic_suffix(np.array([0.3, 0.6, 0.5, 0.4]), ["a", "b", "c", "d"])
    assert rates.tolist() == [0.3, 0.6] and kept == ["a", "b"]
    rates, kept = remove_monotonic_suffix(np.array([0.6, 0.5]), ["a", "b"])
    assert rates.size == 0 and kept == []


@pytest.mark.parametrize(
    "mode, expected",
    [
        ("self_play", {("self_play", "main"): 1.0}),
        ("uniform", {("uniform", "main@1"): 1 / 3, ("uniform", "main@2"): 1 / 3, ("uniform", "main"): 1 / 3}),
        (
            "pfsp",
            {
                ("pfsp", "main@1"): 0.0625 / 0.9525,
                ("pfsp", "main@2"): 0.25 / 0.9525,
                ("pfsp", "x@1"): 0.64 / 0.9525,
            },
        ),
    ],
)
def test_main_player_modes(make_league, mode, expected):
    league = league_with_history(make_league, {"matchmaking": mode})
    set_record(league, "main", "main@1", 3, 1)
    set_record(league, "main", "main@2", 1, 1)
    set_record(league, "main", "x@1", 1, 4)
    assert_shares(draw(league, "main", 6000), 6000, expected)


def test_main_exploiter_switches_to_history_at_win_rate_0_1(make_league):
    league = league_with_history(make_league, {})
    league.add_snapshot("main-now.pt", 5)
    set_record(league, "x", "main", 1, 4)  # 0.2 > 0.1: keep exploiting main's current parameters
    match = league.choose("x")
    assert (match.kind, match.opponent, match.opponent_snapshot) == ("exploit", "main", "main-now.pt")
    assert draw(league, "x", 500) == Counter({("exploit", "main"): 500})
    set_record(league, "x", "main", 0, 5)  # 1 / 10 = 0.1, not above: PFSP variance over main's history
    set_record(league, "x", "main@2", 1, 4)  # 0.2; main@1 unplayed: 0.5
    n = 20_000  # x(1-x): 0.25 and 0.16
    assert_shares(draw(league, "x", n), n, {("pfsp", "main@1"): 25 / 41, ("pfsp", "main@2"): 16 / 41})


def test_league_exploiter_plays_pfsp_linear_capped_over_all_history(make_league):
    league = league_with_history(make_league, {}, exploiter="league_exploiter")
    set_record(league, "x", "main@1", 1, 4)  # 0.2 -> min(0.5, 0.8) = 0.5
    set_record(league, "x", "main@2", 3, 2)  # 0.6 -> 0.4
    set_record(league, "x", "x@1", 9, 1)  # 0.9 -> 0.1
    n = 20_000
    assert_shares(draw(league, "x", n), n, {("pfsp", "main@1"): 0.5, ("pfsp", "main@2"): 0.4, ("pfsp", "x@1"): 0.1})


def test_snapshot_every_steps(make_league):
    league = make_league({"snapshot": {"every_steps": 1000}})
    assert not league.snapshot_due("main", 999) and league.snapshot_due("main", 1000)
    assert league.freeze("main", "s1000", 1000) == ("main@1000", False)
    assert not league.snapshot_due("main", 1000) and not league.snapshot_due("main", 1999)
    assert league.snapshot_due("main", 2000)
    assert league.player("main").last_frozen_step == 1000 and league.player("main@1000").snapshot == "s1000"


def test_snapshot_when_the_win_rate_passes_the_threshold(make_league):
    league = make_league({**EXACT, "snapshot": {"win_rate": 0.7, "min_steps": 500}})
    assert not league.snapshot_due("main", 10**6)  # no history: nothing to beat, and no every_steps
    league.freeze("main", "s100", 100)
    set_record(league, "main", "main@100", 7, 3)  # exactly 0.7: not above
    assert not league.snapshot_due("main", 700)
    set_record(league, "main", "main@100", 1, 0)  # 8 / 11
    assert not league.snapshot_due("main", 599)  # 499 steps since the last snapshot < min_steps
    assert league.snapshot_due("main", 600)
    league.freeze("main", "s600", 600)
    assert not league.snapshot_due("main", 2000)  # main@600 is unplayed (0.5): main must beat it first


def test_main_exploiter_resets_and_starts_over(make_league):
    league = make_league({**EXACT, "players": [{"name": "main"}, {"name": "me", "kind": "main_exploiter"}]})
    set_record(league, "me", "main", 4, 1)  # 0.8 > 0.7 against the main player
    assert league.snapshot_due("me", 10)
    rating = league.ratings()["me"]
    assert rating > 1200.0
    assert league.freeze("me", "me10", 10) == ("me@10", True)
    me = league.player("me")
    assert (me.resets, me.last_frozen_step, me.step) == (1, 10, 10)
    assert league.ratings()["me"] == 1200.0 and league.ratings()["me@10"] == rating
    assert league.payoff.stats("me", "main").total == 0  # its rows described the parameters it dropped
    assert not league.snapshot_due("me", 20)
    assert league.freeze("main", "m", 20) == ("main@20", False)  # main players never reset


def test_league_exploiter_reset_frequency():
    league = League(MemoryStore(), {"players": [{"name": "le", "kind": "league_exploiter"}]}, rng=1)
    n, resets = 2000, 0
    for step in range(1, n + 1):
        resets += league.freeze("le", f"s{step}", step)[1]
    assert abs(resets - 0.25 * n) <= 4.5 * math.sqrt(n * 0.25 * 0.75)
    assert league.player("le").resets == resets
    again = League(MemoryStore(), {"players": [{"name": "le", "kind": "league_exploiter"}]}, rng=1)
    first = [league.freeze("le", "t", 10**6 + i, rng=np.random.default_rng(5))[1] for i in range(20)]
    second = [again.freeze("le", "t", 10**6 + i, rng=np.random.default_rng(5))[1] for i in range(20)]
    assert first == second  # a passed generator decides the draw


def test_keep_history_forgets_the_oldest(make_league):
    league = make_league({**EXACT, "keep_history": 2})
    for step in (1, 2, 3, 4):
        league.freeze("main", f"s{step}", step)
    set_record(league, "main", "main@1", 1, 0)
    assert league.forget_old_history("main") == ["s1", "s2"]
    assert league.history() == ["main@3", "main@4"] and league.forget_old_history("main") == []
    assert "main@1" not in league.ratings() and league.to_rows() == []
    assert league.freeze("main", "again", 4)[0] == "main@4#2"  # a second snapshot at the same step
    assert make_league({}).forget_old_history("main") == []  # keep_history: null keeps everything


def test_nash_matchmaking_draws_the_other_seats_mixture(make_league):
    league = league_with_history(make_league, {"matchmaking": "nash"})
    # before any mixture is known: uniform over the main player's own history and its current parameters
    assert_shares(
        draw(league, "main", 3000),
        3000,
        {("nash", "main@1"): 1 / 3, ("nash", "main@2"): 1 / 3, ("nash", "main"): 1 / 3},
    )
    league.set_mixture("main", {"main@1": (0.2, 0.9), "main@2": (0.8, 0.1)})
    rng = np.random.default_rng(1)
    # the learner at seat 0 meets seat 1's mixture (0.9, 0.1); at seat 1, seat 0's (0.2, 0.8)
    for seat, share in ((0, 0.9), (1, 0.2)):
        picks = Counter(league.choose("main", rng, seat=seat).opponent for _ in range(4000))
        assert set(picks) == {"main@1", "main@2"}
        sigma = math.sqrt(4000 * share * (1 - share))
        assert abs(picks["main@1"] - 4000 * share) <= 4.5 * sigma, (seat, picks)
