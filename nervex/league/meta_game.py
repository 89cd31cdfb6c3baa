"""The meta-game of a population: each policy's expected payoff against each other, and its Nash mixture (PSRO).

PSRO reports its population as the Nash equilibrium of the *meta-game*, the game whose pure strategies are the
population's policies; fictitious play reports the uniform mixture. In a two-seat game a policy plays each seat
with a different part of itself, so the meta-game has two sides: seat 0 mixes the population's seat-0 play, seat 1
its seat-1 play, with payoffs ``R[i, j] = v_0(i at seat 0, j at seat 1)`` (``seat_nash``: one weight row per seat,
as ``nervex.league.exploitability`` takes them). ``population_values`` scores policy ``i`` against ``j`` over both
seatings, ``M[i, j] = (v_0(i at 0, j at 1) + v_1(j at 0, i at 1)) / 2``, antisymmetric for a zero-sum game.
``meta_nash(M)`` solves ``max_x min_j (x^T M)_j`` by linear programming.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .exploitability import ActionProbs, expected_returns


def meta_nash(payoff: np.ndarray) -> np.ndarray:
    """The row player's maximin mixture of a matrix game (its Nash strategy when the game is zero-sum).

    Args:
        payoff: ``(n, m)`` payoffs of the row player.

    Returns:
        ``(n,)`` probabilities.

    Raises:
        ValueError: an empty or non-finite matrix, or a linear program that fails.
    """
    from scipy.optimize import linprog

    payoff = np.asarray(payoff, dtype=np.float64)
    if payoff.ndim != 2 or payoff.size == 0 or not np.isfinite(payoff).all():
        raise ValueError(f"meta_nash needs a finite (n, m) payoff matrix, got shape {payoff.shape}")
    n, m = payoff.shape
    # variables (x_1..x_n, v): maximise v  s.t.  v - (x^T M)_j <= 0 for every column j,  sum x = 1,  x >= 0
    cost = np.zeros(n + 1)
    cost[-1] = -1.0
    a_ub = np.hstack([-payoff.T, np.ones((m, 1))])
    a_eq = np.hstack([np.ones((1, n)), np.zeros((1, 1))])
    bounds = [(0.0, None)] * n + [(None, None)]
    solved = linprog(cost, A_ub=a_ub, b_ub=np.zeros(m), A_eq=a_eq, b_eq=[1.0], bounds=bounds, method="highs")
    if not solved.success:
        raise ValueError(f"meta_nash: the linear program failed: {solved.message}")
    x = np.clip(solved.x[:n], 0.0, None)
    return x / x.sum()


def population_values(game: Any, policies: Sequence[ActionProbs]) -> np.ndarray:
    """``M[i, j]``: policy i's expected payoff against policy j, averaged over the two seatings (exact).

    Args:
        game: As ``nervex.league.exploitability.exploitability`` takes it (a matrix game, an open_spiel game).
        policies: The population as ``ActionProbs``.
    """
    if not policies:
        raise ValueError("population_values needs at least one policy")
    returns = expected_returns(game, policies)  # [i, j, s]: i at seat 0, j at seat 1
    return (returns[..., 0] + returns[..., 1].T) / 2.0


def seat_nash(game: Any, policies: Sequence[ActionProbs]) -> np.ndarray:
    """The two-sided meta-game's Nash mixture (zero-sum): ``(2, n)`` weights, row ``s`` mixing seat ``s``'s play.

    Seat 0 takes the maximin mixture of ``R0[i, j] = v_0(i at seat 0, j at seat 1)``; seat 1 that of its own
    payoffs ``v_1`` with its policies as rows.
    """
    if not policies:
        raise ValueError("seat_nash needs at least one policy")
    returns = expected_returns(game, policies)  # [i, j, s]: i at seat 0, j at seat 1
    return np.stack([meta_nash(returns[..., 0]), meta_nash(returns[..., 1].T)])


__all__ = ["meta_nash", "population_values", "seat_nash"]
