"""The meta-game: maximin mixtures by linear programming, population payoffs, and per-seat Nash weights."""

from __future__ import annotations

import numpy as np
import pytest

from nervex.envs.matrix_game import MATRIX_GAMES
from nervex.league.exploitability import exploitability
from nervex.league.meta_game import meta_nash, population_values, seat_nash


def pure(seat0: int, seat1: int, n: int):
    """A policy playing action ``seat0`` at seat 0 and ``seat1`` at seat 1 (of ``n`` actions)."""

    def probs(obs, mask, seat):
        rows = np.zeros((len(seat), n))
        rows[np.arange(len(seat)), np.where(np.asarray(seat) == 0, seat0, seat1)] = 1.0
        return rows

    return probs


def test_meta_nash_of_known_games():
    rps = np.array([[0, -1, 1], [1, 0, -1], [-1, 1, 0]], dtype=float)
    assert meta_nash(rps) == pytest.approx([1 / 3] * 3, abs=1e-9)
    # DI-engine's 2x2 game for the row player: 3x - 2(1-x) = -2x + (1-x)  ->  x = 3/8
    assert meta_nash(np.array([[3.0, -2.0], [-2.0, 1.0]])) == pytest.approx([0.375, 0.625], abs=1e-9)
    # a dominated row gets no weight
    assert meta_nash(np.array([[1.0, 1.0], [0.0, 0.0]])) == pytest.approx([1.0, 0.0], abs=1e-9)
    with pytest.raises(ValueError, match="finite"):
        meta_nash(np.array([[np.nan]]))


def test_population_values_and_seat_nash_on_rps():
    population = [pure(0, 0, 3), pure(1, 1, 3), pure(2, 2, 3)]  # rock, paper, scissors in both seats
    values = population_values("rps", population)
    assert values == pytest.approx(-values.T)  # zero-sum, scored over both seatings
    assert values[1, 0] == pytest.approx(1.0) and values[0, 1] == pytest.approx(-1.0)  # paper beats rock
    weights = seat_nash("rps", population)
    assert weights.shape == (2, 3) and weights == pytest.approx(np.full((2, 3), 1 / 3), abs=1e-9)
    assert exploitability("rps", population, weights) == pytest.approx(0.0, abs=1e-9)
    assert exploitability("rps", population[:2], [0.5, 0.5]) == pytest.approx(0.5)  # scissors beats R/P: 1/2


def test_per_seat_weights_reach_a_nash_one_row_cannot():
    # two policies of the 2x2 game: (0 at seat 0, 1 at seat 1) and (1 at seat 0, 0 at seat 1); the Nash plays
    # action 0 with 3/8 at both seats, which needs weights (3/8, 5/8) at seat 0 and (5/8, 3/8) at seat 1
    payoff = MATRIX_GAMES["zero_sum_2x2"]
    population = [pure(0, 1, 2), pure(1, 0, 2)]
    assert exploitability(payoff, population, [[0.375, 0.625], [0.625, 0.375]]) == pytest.approx(0.0, abs=1e-12)
    # one row for both seats: seat 0 plays 0 with 3/8, seat 1 with 5/8: seat 0 then best-responds with action 0
    # (3 x 5/8 - 2 x 3/8 = 9/8 against the value -1/8) and seat 1 with action 1 (-(-2 x 3/8 + 1 x 5/8) = 1/8):
    # NashConv = (9/8 + 1/8) + (1/8 - 1/8) = 5/4, exploitability 5/8
    assert exploitability(payoff, population, [0.375, 0.625]) == pytest.approx(0.625)
    weights = seat_nash(payoff, population)
    assert weights == pytest.approx(np.array([[0.375, 0.625], [0.625, 0.375]]), abs=1e-9)
