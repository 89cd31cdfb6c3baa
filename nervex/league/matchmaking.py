"""Who a player plays next: AlphaStar's matchmaking (``MainPlayer``, ``MainExploiter``, ``LeagueExploiter``).

A ``Matchmaker`` reads the payoff table and the list of players and returns a ``Match``; it keeps no state, so the
league's store stays the one owner of players and payoff rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .payoff import Payoff
from .pfsp import pfsp
from .player import LEAGUE_EXPLOITER, MAIN, MAIN_EXPLOITER, Player

MATCH_KINDS = ("self_play", "pfsp", "verification", "uniform", "exploit", "nash")


@dataclass(frozen=True)
class Match:
    """The opponent of a player's next games.

    Attributes:
        player: The learning player's id.
        opponent: The opponent's id: an active player's (``player`` itself for self-play) or a historical one's.
        opponent_snapshot: The storage name of the parameters the opponent plays with: a historical player's frozen
            ones, an active opponent's newest published ones (None before it published any: use its live
            parameters); None when ``opponent == player`` (self-play with the player's current parameters).
        kind: The branch that chose it: ``self_play``, ``pfsp``, ``verification``, ``uniform`` or ``exploit`` (a
            main exploiter against a main player's current parameters).
    """

    player: str
    opponent: str
    opponent_snapshot: Optional[str]
    kind: str


def remove_monotonic_suffix(win_rates: np.ndarray, players: Sequence[Player]) -> Tuple[np.ndarray, List[Player]]:
    """Drop the newest snapshots while win rates fall toward the newest (AlphaStar's verification: those are the
    snapshots still being overtaken, not forgotten ones); nothing is left when the whole sequence falls."""
    for i in range(len(win_rates) - 1, 0, -1):
        if win_rates[i - 1] < win_rates[i]:
            return win_rates[: i + 1], list(players[: i + 1])
    return np.zeros(0), []


class Matchmaker:
    """AlphaStar's opponent choice for each kind of player, over a payoff table.

    Args:
        cfg: The resolved ``league:`` section (``resolve_league_config``).
        payoff: The league's payoff table.
    """

    def __init__(self, cfg: Dict[str, Any], payoff: Payoff) -> None:
        self.cfg = cfg
        self.payoff = payoff
        # matchmaking 'nash' (PSRO): per main player, each historical id's meta-game Nash weight per seat
        self.mixtures: Dict[str, Dict[str, Tuple[float, float]]] = {}

    def choose(
        self, player: Player, everyone: Sequence[Player], rng: np.random.Generator, seat: Optional[int] = None
    ) -> Match:
        """The opponent of ``player`` (an active player) among ``everyone`` (every player, oldest first); ``seat``:
        the player's seat in these games (matchmaking ``nash`` draws the opponent from the other seat's mixture)."""
        if player.kind == MAIN and self.cfg["matchmaking"] == "nash":
            return self._nash(player, everyone, rng, seat)
        if player.kind == MAIN:
            return self._main(player, everyone, rng)
        if player.kind == MAIN_EXPLOITER:
            return self._main_exploiter(player, everyone, rng)
        if player.kind == LEAGUE_EXPLOITER:
            history = [q for q in everyone if q.historical]
            return self._pfsp(player, history, self.cfg["league_exploiter_weighting"], rng, "pfsp")
        raise ValueError(f"player '{player.player_id}' of kind '{player.kind}' does not learn: it has no matches")

    def snapshot_opponents(self, player: Player, everyone: Sequence[Player]) -> List[Player]:
        """The opponents whose win rates decide when ``player`` is frozen: for a main player every historical one
        (its own history under ``uniform``, none under ``self_play``), for a main exploiter the main players, for
        a league exploiter every historical one."""
        if player.kind == MAIN_EXPLOITER:
            return [q for q in everyone if q.kind == MAIN]
        if player.kind == MAIN and self.cfg["matchmaking"] == "self_play":
            return []
        if player.kind == MAIN and self.cfg["matchmaking"] in ("uniform", "nash"):
            return [q for q in everyone if q.historical and q.parent == player.player_id]
        return [q for q in everyone if q.historical]

    def _main(self, player: Player, everyone: Sequence[Player], rng: np.random.Generator) -> Match:
        history = [q for q in everyone if q.historical]
        mode = self.cfg["matchmaking"]
        if not history or mode == "self_play":
            return _self_play(player)
        if mode == "uniform":
            return _uniform_own(player, [q for q in history if q.parent == player.player_id], rng, "uniform")
        if mode == "pfsp":
            return self._pfsp(player, history, self.cfg["pfsp_weighting"], rng, "pfsp")
        mix, coin = self.cfg["main_mix"], float(rng.random())
        if coin < mix["pfsp"]:
            return self._pfsp(player, history, self.cfg["pfsp_weighting"], rng, "pfsp")
        if coin < mix["pfsp"] + mix["self_play"]:
            return _self_play(player)
        return self._verification(player, everyone, rng) or _self_play(player)

    def _nash(self, player: Player, everyone: Sequence[Player], rng: np.random.Generator, seat: Optional[int]) -> Match:
        """PSRO's opponent: a snapshot of the player's own history drawn by the meta-game's Nash mixture of the
        opponent's seat (``mixtures``, set by whoever solves the meta-game); uniform over the history and the current
        parameters until a mixture is known."""
        own = [q for q in everyone if q.historical and q.parent == player.player_id]
        mixture = self.mixtures.get(player.player_id) or {}
        rows = [mixture.get(q.player_id, (0.0, 0.0)) for q in own]
        weights = np.array([w[1 - seat] if seat in (0, 1) else (w[0] + w[1]) / 2 for w in rows])
        if not own or weights.sum() <= 0:
            return _uniform_own(player, own, rng, "nash")
        return _against(player, own[_draw(weights, rng)], "nash")

    def _verification(self, player: Player, everyone: Sequence[Player], rng: np.random.Generator) -> Optional[Match]:
        """AlphaStar's verification branch: exploiters' snapshots when one of them still beats the main player
        (win rate below ``exploiters_below``), else its own snapshots it may have forgotten how to beat."""
        ver = self.cfg["verification"]
        exploiters = {q.player_id for q in everyone if q.kind == MAIN_EXPLOITER}
        exploiter_history = [q for q in everyone if q.historical and q.parent in exploiters]
        if exploiter_history:
            rates = self.payoff.win_rates(player.player_id, [q.player_id for q in exploiter_history])
            if rates.min() < ver["exploiters_below"]:
                return self._pick(player, exploiter_history, rates, ver["weighting"], rng, "verification")
        own = [q for q in everyone if q.historical and q.parent == player.player_id]
        rates, own = remove_monotonic_suffix(self.payoff.win_rates(player.player_id, [q.player_id for q in own]), own)
        if len(own) and rates.min() < ver["history_below"]:
            return self._pick(player, own, rates, ver["weighting"], rng, "verification")
        return None

    def _main_exploiter(self, player: Player, everyone: Sequence[Player], rng: np.random.Generator) -> Match:
        mains = [q for q in everyone if q.kind == MAIN]
        if not mains:
            raise ValueError(f"main exploiter '{player.player_id}' has no main player to exploit")
        target = mains[int(rng.integers(len(mains)))] if len(mains) > 1 else mains[0]
        history = [q for q in everyone if q.historical and q.parent == target.player_id]
        if (
            not history
            or self.payoff.win_rate(player.player_id, target.player_id) > self.cfg["main_exploiter_win_rate"]
        ):
            return _against(player, target, "exploit")
        return self._pfsp(player, history, self.cfg["main_exploiter_weighting"], rng, "pfsp")

    def _pfsp(self, player: Player, candidates: List[Player], weighting: str, rng: np.random.Generator, kind: str):
        if not candidates:
            return _self_play(player)
        rates = self.payoff.win_rates(player.player_id, [q.player_id for q in candidates])
        return self._pick(player, candidates, rates, weighting, rng, kind)

    @staticmethod
    def _pick(player: Player, candidates, rates: np.ndarray, weighting: str, rng, kind: str) -> Match:
        return _against(player, candidates[_draw(pfsp(rates, weighting), rng)], kind)


def _draw(weights: np.ndarray, rng: np.random.Generator) -> int:
    """An index drawn in proportion to ``weights`` (not all zero): an inverse-CDF draw of one uniform number, as
    ``rng.choice(p=...)`` takes, at a fraction of its overhead."""
    cumulative = np.cumsum(weights)
    return min(int(np.searchsorted(cumulative, rng.random() * cumulative[-1], side="right")), len(weights) - 1)


def _uniform_own(player: Player, own: Sequence[Player], rng: np.random.Generator, kind: str) -> Match:
    """Uniformly one of the player's own snapshots or its current parameters (self-play before any snapshot)."""
    if not own:
        return _self_play(player)
    pick = int(rng.integers(len(own) + 1))
    return (
        _against(player, own[pick], kind) if pick < len(own) else Match(player.player_id, player.player_id, None, kind)
    )


def _self_play(player: Player) -> Match:
    return Match(player.player_id, player.player_id, None, "self_play")


def _against(player: Player, opponent: Player, kind: str) -> Match:
    return Match(player.player_id, opponent.player_id, opponent.snapshot, kind)


__all__ = ["MATCH_KINDS", "Match", "Matchmaker", "remove_monotonic_suffix"]
