"""Prioritized fictitious self-play (PFSP): opponents weighted by how hard they are (AlphaStar, Vinyals et al. 2019).

``f(x)`` turns the learner's win rate ``x`` against each candidate into a weight; the weights, normalised, are the
probabilities of playing each candidate. ``squared`` (1-x)^2 and ``linear`` (1-x) favour the hardest opponents,
``variance`` x(1-x) the ones at the learner's level (win rate near 0.5), ``linear_capped`` min(0.5, 1-x) the hard
ones without neglecting those it already beats half the time.
"""

from __future__ import annotations

import difflib
from typing import Callable, Dict, Sequence

import numpy as np

PFSP_WEIGHTINGS: Dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "variance": lambda x: x * (1.0 - x),
    "linear": lambda x: 1.0 - x,
    "linear_capped": lambda x: np.minimum(0.5, 1.0 - x),
    "squared": lambda x: (1.0 - x) ** 2,
}
"""Weighting name -> ``f(win_rates) -> weights``."""

ZERO_WEIGHT = 1e-10
"""Below this total weight every candidate is equally likely (AlphaStar's threshold)."""


def check_weighting(weighting: str, where: str = "weighting") -> str:
    """Return ``weighting`` when it is a PFSP weighting.

    Raises:
        ValueError: it is not one, with a suggestion.
    """
    if weighting not in PFSP_WEIGHTINGS:
        close = difflib.get_close_matches(str(weighting), list(PFSP_WEIGHTINGS), n=1, cutoff=0.6)
        hint = f"did you mean '{close[0]}'?" if close else f"valid: {', '.join(PFSP_WEIGHTINGS)}"
        raise ValueError(f"{where} is {weighting!r}, not a PFSP weighting; {hint}")
    return weighting


def pfsp(win_rates: Sequence[float], weighting: str = "squared") -> np.ndarray:
    """The probability of playing each candidate given the learner's win rate against it.

    Args:
        win_rates: The learner's win rate against each candidate, each in [0, 1].
        weighting: A key of ``PFSP_WEIGHTINGS``.

    Returns:
        Probabilities (float64, summing to 1): ``f(x) / sum f(x)``, uniform when every weight is ~0 (for example
        ``squared`` when the learner beats every candidate).

    Shapes:
        win_rates: (N,) with N >= 1; returns (N,).

    Raises:
        ValueError: an unknown weighting, no candidates, or a win rate outside [0, 1] or not finite.
    """
    fn = PFSP_WEIGHTINGS[check_weighting(weighting)]
    x = np.asarray(win_rates, dtype=np.float64)
    if x.ndim != 1 or x.size == 0:
        raise ValueError(f"pfsp needs a non-empty 1-D vector of win rates, got shape {x.shape}")
    if not (x.min() >= 0.0 and x.max() <= 1.0):  # NaN fails both comparisons
        raise ValueError(f"pfsp win rates must lie in [0, 1], got {x.tolist()}")
    weights = fn(x)
    total = float(weights.sum())
    if total < ZERO_WEIGHT:
        return np.full(x.size, 1.0 / x.size)
    return weights / total


__all__ = ["PFSP_WEIGHTINGS", "ZERO_WEIGHT", "check_weighting", "pfsp"]
