"""The league's players: active learners (main players and exploiters) and their frozen historical snapshots."""

from __future__ import annotations

from dataclasses import dataclass
from typing import AbstractSet, Optional, Tuple

MAIN = "main"
MAIN_EXPLOITER = "main_exploiter"
LEAGUE_EXPLOITER = "league_exploiter"
HISTORICAL = "historical"
ACTIVE_KINDS: Tuple[str, ...] = (MAIN, MAIN_EXPLOITER, LEAGUE_EXPLOITER)
"""The kinds of players that learn (the kinds a config's ``players`` list may name)."""
PLAYER_KINDS: Tuple[str, ...] = (*ACTIVE_KINDS, HISTORICAL)


@dataclass(frozen=True)
class Player:
    """One player of the league, active or historical (a frozen snapshot of an active player).

    Attributes:
        player_id: Its id: a configured name (``main``) for an active player, ``<parent>@<step>`` for a historical
            one (``main@20000``; ``main@20000#2`` when that id is taken).
        kind: ``main``, ``main_exploiter``, ``league_exploiter`` or ``historical``.
        parent: For a historical player, the active player it was frozen from; None for an active one.
        snapshot: The storage name (or path) of its parameters: for a historical player the frozen ones, for an
            active one its newest published ones (None before the first).
        step: Steps trained (in the unit its trainer counts: env steps in serial mode, learner iterations in the
            parallel league manager); for a historical player, its parent's step when it was frozen.
        created_at: Unix time it entered the league.
        last_frozen_step: An active player's ``step`` at its last snapshot into history (0 before the first).
        resets: How many times an active player's parameters were reset to their initial values after a snapshot.
    """

    player_id: str
    kind: str
    parent: Optional[str] = None
    snapshot: Optional[str] = None
    step: int = 0
    created_at: float = 0.0
    last_frozen_step: int = 0
    resets: int = 0

    @property
    def historical(self) -> bool:
        """Whether it is a frozen snapshot (never learns, only plays as an opponent)."""
        return self.kind == HISTORICAL


def historical_id(parent: str, step: int, taken: AbstractSet[str]) -> str:
    """The id of a snapshot of ``parent`` frozen at ``step``: ``parent@step``, or ``parent@step#n`` when taken."""
    base = f"{parent}@{int(step)}"
    candidate, n = base, 1
    while candidate in taken:
        n += 1
        candidate = f"{base}#{n}"
    return candidate


__all__ = [
    "ACTIVE_KINDS",
    "HISTORICAL",
    "LEAGUE_EXPLOITER",
    "MAIN",
    "MAIN_EXPLOITER",
    "PLAYER_KINDS",
    "Player",
    "historical_id",
]
