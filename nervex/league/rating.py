"""Elo ratings of the league's players and snapshots."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Tuple


@dataclass(frozen=True)
class Elo:
    """The Elo rating system: expected score ``1 / (1 + 10^((r_b - r_a) / 400))``, update ``r += k (s - E)``.

    Args:
        k: The update step (points per game of surprise).
        initial: A new player's rating.
    """

    k: float = 16.0
    initial: float = 1200.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.k) and 0.0 < self.k <= 1000.0):
            raise ValueError(f"Elo k must lie in (0, 1000], got {self.k}")
        if not (math.isfinite(self.initial) and abs(self.initial) <= 1e6):
            raise ValueError(f"Elo initial rating must be finite and within +-1e6, got {self.initial}")

    @staticmethod
    def expected(rating: float, other: float) -> float:
        """The expected score (win 1, draw 0.5, loss 0) of a player rated ``rating`` against one rated ``other``."""
        return 1.0 / (1.0 + 10.0 ** ((other - rating) / 400.0))

    def update(self, home: float, away: float, score: float) -> Tuple[float, float]:
        """Both ratings after one game.

        Args:
            home: Home's rating before the game.
            away: Away's rating before it.
            score: Home's score: 1 (win), 0.5 (draw) or 0 (loss).

        Returns:
            ``(home, away)`` after the game (their sum is unchanged).
        """
        delta = self.k * (score - self.expected(home, away))
        return home + delta, away - delta


__all__ = ["Elo"]
