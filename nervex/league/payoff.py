"""The payoff table: decayed wins, draws and losses of every ordered pair of players (AlphaStar's ``Payoff``).

Each game multiplies both directions' games, wins, draws and losses by ``decay`` before adding it, so the table
follows players whose strength changes (the effective number of games tends to ``1 / (1 - decay)``). The win rate of
``home`` against ``away`` is ``(wins + draws / 2) / games``, 0.5 while ``games < min_games``.
"""

from __future__ import annotations

from typing import Dict, Optional, Sequence, Union

import numpy as np

from .store import Change, LeagueStore, Pair, PairStats

Result = Union[int, float, str]
RESULTS = {"win": 1, "draw": 0, "loss": -1}


def result_sign(result: Result) -> int:
    """A game's result from home's view as +1 (win), 0 (draw) or -1 (loss).

    Raises:
        ValueError: anything else (an outcome of 0.5, 'won', NaN).
    """
    if isinstance(result, str):
        if result not in RESULTS:
            raise ValueError(f"a result is 'win', 'draw' or 'loss' (or +1, 0, -1), got {result!r}")
        return RESULTS[result]
    if isinstance(result, (bool, np.bool_)) or result not in (1, 0, -1):
        raise ValueError(f"a result is +1, 0 or -1 (or 'win', 'draw', 'loss'), got {result!r}")
    return int(result)


def check_payoff_settings(decay: float, min_games: float, where: str = "payoff") -> None:
    """Check ``decay`` and ``min_games``.

    Raises:
        ValueError: ``decay`` outside (0, 1], ``min_games`` negative, or ``min_games`` at or above
            ``1 / (1 - decay)``, the most games decayed counts ever reach (every win rate would stay 0.5).
    """
    if isinstance(decay, bool) or not (isinstance(decay, (int, float)) and 0.0 < decay <= 1.0):
        raise ValueError(f"{where}.decay must lie in (0, 1], got {decay!r}")
    if isinstance(min_games, bool) or not (isinstance(min_games, (int, float)) and 0.0 <= min_games <= 1e9):
        raise ValueError(f"{where}.min_games must lie in [0, 1e9], got {min_games!r}")
    if decay < 1.0 and min_games > 0 and min_games >= 1.0 / (1.0 - decay):
        raise ValueError(
            f"{where}.min_games={min_games} is never reached with {where}.decay={decay}: decayed game counts stay "
            f"below 1 / (1 - decay) = {1.0 / (1.0 - decay):.4g}; lower min_games or raise decay"
        )


class Payoff:
    """Decayed payoff statistics of every ordered pair, kept in a league store.

    Args:
        store: Where the rows live (``MemoryStore`` or ``SQLiteStore``).
        decay: Each game first multiplies the pair's counts (both directions) by this, in (0, 1]; 1: no decay.
        min_games: Below this many (decayed) games a win rate is 0.5.

    Raises:
        ValueError: settings out of range (see ``check_payoff_settings``).
    """

    def __init__(self, store: LeagueStore, decay: float = 0.99, min_games: float = 8) -> None:
        check_payoff_settings(decay, min_games)
        self.store = store
        self.decay = float(decay)
        self.min_games = float(min_games)

    def updated(self, home: str, away: str, result: Result) -> Dict[Pair, PairStats]:
        """Both directions' rows after one more game (not written; ``update`` writes them).

        Raises:
            ValueError: ``home == away`` or a bad result.
        """
        if home == away:
            raise ValueError(f"a payoff row needs two players, got {home!r} against itself")
        sign = result_sign(result)
        return {
            (home, away): self._add(self.store.stats(home, away), sign),
            (away, home): self._add(self.store.stats(away, home), -sign),
        }

    def _add(self, s: PairStats, sign: int) -> PairStats:
        d = self.decay
        return PairStats(
            games=s.games * d + 1.0,
            wins=s.wins * d + (sign > 0),
            draws=s.draws * d + (sign == 0),
            losses=s.losses * d + (sign < 0),
            total=s.total + 1,
        )

    def update(self, home: str, away: str, result: Result, key: Optional[str] = None) -> bool:
        """Count one game of ``home`` against ``away`` in both directions.

        Args:
            home: One player's id.
            away: The other's.
            result: Home's result: +1, 0, -1 or 'win', 'draw', 'loss'.
            key: The outcome's unique key: a second update with the same key counts nothing.

        Returns:
            Whether the game was counted (False: ``key`` was counted before).
        """
        if key is not None and self.store.applied(key):
            return False
        return self.store.apply(Change(stats=self.updated(home, away, result), key=key))

    def stats(self, home: str, away: str) -> PairStats:
        """Home's statistics against away (zeros when they never played)."""
        return self.store.stats(home, away)

    def win_rate(self, home: str, away: str) -> float:
        """``(wins + draws / 2) / games`` of home against away; 0.5 while ``games < min_games`` (or none)."""
        s = self.store.stats(home, away)
        if s.games <= 0.0 or s.games < self.min_games:
            return 0.5
        return (s.wins + 0.5 * s.draws) / s.games

    def win_rates(self, home: str, aways: Sequence[str]) -> np.ndarray:
        """Home's win rate against each of ``aways``, shape (len(aways),)."""
        return np.array([self.win_rate(home, away) for away in aways], dtype=np.float64)

    def table(self, ids: Sequence[str]) -> np.ndarray:
        """The win rate of each row's player against each column's, shape (N, N); 0.5 on the diagonal."""
        out = np.full((len(ids), len(ids)), 0.5)
        for i, home in enumerate(ids):
            for j, away in enumerate(ids):
                if i != j:
                    out[i, j] = self.win_rate(home, away)
        return out


__all__ = ["PairStats", "Payoff", "RESULTS", "check_payoff_settings", "result_sign"]
