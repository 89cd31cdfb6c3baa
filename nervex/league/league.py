"""The league (AlphaStar, Vinyals et al. 2019; DI-engine's names): players, payoff, matchmaking, snapshots, ratings.

Active players learn: ``main`` players, ``main_exploiter`` s (they hunt the main players' weaknesses) and
``league_exploiter`` s (they hunt the whole league's). Each is frozen now and then into a ``historical`` player, a
fixed snapshot that others play against. ``choose`` picks a learner's next opponent, ``record`` counts a game's
outcome (payoff table and Elo, idempotent by key), ``snapshot_due`` and ``freeze`` move players into history. The
state lives in a store (``MemoryStore`` or ``SQLiteStore``); the league itself holds only the config and an rng.

The parallel league manager uses the same class through ``League.open(path, cfg)`` and the methods of the first,
one-player league: ``current``, ``add_snapshot``, ``wants_history``, ``forget_old_history`` and ``task_choice``.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

import numpy as np

from nervex.config import ConfigError

from .config import resolve_eval_config, resolve_league_config
from .matchmaking import Match, Matchmaker
from .payoff import Payoff, Result, result_sign
from .player import HISTORICAL, LEAGUE_EXPLOITER, MAIN, MAIN_EXPLOITER, Player, historical_id
from .rating import Elo
from .store import Change, LeagueStore, MemoryStore, SQLiteStore

MAIN_PLAYER = "main"
RngLike = Union[None, int, np.random.Generator]


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """An active player's newest published snapshot (``League.current``): storage name, step, and whether it is
    also kept in history."""

    name: str
    player_id: str
    policy_iter: int
    history: bool


class League:
    """A league of players over a store.

    Config (the ``league:`` section; defaults in ``nervex.league.DEFAULT_LEAGUE_CONFIG``):

    * ``players`` (``[{name: main, kind: main}]``): the active players; ``kind`` is ``main``, ``main_exploiter``
      (needs a main player) or ``league_exploiter``; names are unique, without ``@``, ``#``, ``/`` or spaces.
    * ``matchmaking`` (``alphastar``): how main players choose: ``self_play`` (always its own current parameters),
      ``uniform`` (uniform over its own history plus its current parameters), ``pfsp`` (PFSP over every historical
      player), ``alphastar`` (the ``main_mix`` of PFSP, self-play and verification).
    * ``main_mix`` (``{pfsp: 0.5, self_play: 0.35, verification: 0.15}``): the shares of ``alphastar``; sum to 1.
    * ``pfsp_weighting`` (``squared``): main players' PFSP weighting (``variance``, ``linear``, ``linear_capped``,
      ``squared``).
    * ``verification`` (``{exploiters_below: 0.3, history_below: 0.7, weighting: squared}``): the verification
      share plays main exploiters' snapshots (PFSP) when the main player's win rate against one of them is below
      ``exploiters_below``, else its own snapshots when its win rate against one is below ``history_below`` (the
      newest ones it is still overtaking left out); else self-play.
    * ``main_exploiter_win_rate`` (0.1): a main exploiter plays a main player's current parameters while its win
      rate against them is above this, else PFSP ``main_exploiter_weighting`` (``variance``) over that main
      player's history.
    * ``league_exploiter_weighting`` (``linear_capped``): league exploiters' PFSP over every historical player.
    * ``league_exploiter_reset_prob`` (0.25): the chance a league exploiter restarts from its initial parameters
      when frozen (main exploiters always do, main players never).
    * ``payoff`` (``{decay: 0.99, min_games: 8}``): each game first multiplies a pair's counts by ``decay``; win
      rates are 0.5 below ``min_games`` (decayed) games.
    * ``snapshot`` (``{win_rate: 0.7, min_steps: 0, every_steps: null}``): a player is due for a snapshot when,
      ``min_steps`` or more steps after its last one, its win rate against every opponent of its snapshot set
      (``Matchmaker.snapshot_opponents``) is above ``win_rate``, or ``every_steps`` steps after its last one.
    * ``keep_history`` (null): history snapshots kept per player by ``forget_old_history`` (null: all).
    * ``rating`` (``{kind: elo, k: 16, initial: 1200}``): Elo of every player and snapshot.

    A player's parameters reset (``freeze`` returned True) drop its payoff rows and its rating returns to the
    initial one: they described parameters that no longer play.

    Args:
        store: Where the state lives (None: a new ``MemoryStore``).
        cfg: The ``league:`` section (None: the defaults).
        rng: The generator (or seed) of matchmaking and reset draws when a call does not pass one.

    Raises:
        ConfigError: a bad config (the message names the key), or a store whose active players disagree with it.
    """

    def __init__(
        self, store: Optional[LeagueStore] = None, cfg: Optional[Mapping[str, Any]] = None, rng: RngLike = None
    ) -> None:
        self.cfg = resolve_league_config(cfg)
        self.store = MemoryStore() if store is None else store
        self.rng = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
        self.payoff = Payoff(self.store, **self.cfg["payoff"])
        self.elo = Elo(self.cfg["rating"]["k"], self.cfg["rating"]["initial"])
        self.matchmaker = Matchmaker(self.cfg, self.payoff)
        self._lock = threading.RLock()
        self._add_configured_players()

    @classmethod
    def open(cls, path: str, cfg: Optional[Mapping[str, Any]] = None, rng: RngLike = None) -> League:
        """A league kept in the SQLite file ``path`` (created, or reopened with everything it held)."""
        store = SQLiteStore(path)
        try:
            return cls(store, cfg, rng)
        except BaseException:
            store.close()
            raise

    def _add_configured_players(self) -> None:
        stored = {p.player_id: p for p in self.store.players() if not p.historical}
        names = {entry["name"] for entry in self.cfg["players"]}
        for player_id, player in stored.items():
            if player_id not in names:
                raise ConfigError(
                    f"the league's store holds active player '{player_id}' (kind {player.kind}) that key "
                    f"'league.players' does not list ({sorted(names)}); list it or start a new league"
                )
        new = []
        for entry in self.cfg["players"]:
            old = stored.get(entry["name"])
            if old is not None and old.kind != entry["kind"]:
                raise ConfigError(
                    f"key 'league.players': player '{old.player_id}' is a {entry['kind']} in the config but a "
                    f"{old.kind} in the league's store; keep its kind or start a new league"
                )
            if old is None:
                new.append(Player(entry["name"], entry["kind"], created_at=time.time()))
        if new:
            self.store.apply(Change(players=tuple(new)))

    def close(self) -> None:
        """Close the store; safe to call twice."""
        self.store.close()

    # ---------------------------------------------------------------- queries

    def player(self, player_id: str) -> Player:
        """The record of a player, active or historical.

        Raises:
            KeyError: no such player (never added, or forgotten).
        """
        for player in self.store.players():
            if player.player_id == player_id:
                return player
        raise KeyError(f"no player '{player_id}' in the league (players: {self.players()})")

    def _active(self, player_id: str) -> Player:
        player = self.player(player_id)
        if player.historical:
            raise ValueError(f"player '{player_id}' is a historical snapshot; it does not learn")
        return player

    def players(self) -> List[str]:
        """The active players' ids, in the order they entered the league."""
        return [p.player_id for p in self.store.players() if not p.historical]

    def main_player(self) -> Optional[str]:
        """The first main player's id (the one whose policy a league reports), None without one."""
        return next((p.player_id for p in self.store.players() if p.kind == MAIN), None)

    def history(self, player_id: Optional[str] = None) -> List[str]:
        """The ids of historical players (snapshots of ``player_id`` only, when given), oldest first; ``player``
        gives each one's record (its ``snapshot``, ``step``, ``parent``)."""
        return [p.player_id for p in self._history(player_id)]

    def _history(self, parent: Optional[str]) -> List[Player]:
        return [p for p in self.store.players() if p.historical and parent in (None, p.parent)]

    def payoff_table(self, ids: Optional[List[str]] = None) -> Tuple[List[str], np.ndarray]:
        """``(ids, win_rates)``: each row's win rate against each column (0.5 on the diagonal and below
        ``payoff.min_games``); ``ids`` defaults to every player, active first, then history oldest first."""
        ids = list(ids) if ids is not None else self.players() + self.history()
        return ids, self.payoff.table(ids)

    def ratings(self) -> Dict[str, float]:
        """Every player's Elo (the initial rating for those that never played)."""
        stored = self.store.ratings()
        return {p.player_id: stored.get(p.player_id, self.elo.initial) for p in self.store.players()}

    def to_rows(self) -> List[Dict[str, Any]]:
        """One row per ordered pair that played: ``home, away, games, wins, draws, losses, win_rate`` (decayed
        counts; ``win_rate`` as ``choose`` sees it), home in player order."""
        order = {p.player_id: i for i, p in enumerate(self.store.players())}
        pairs = sorted((pair for pair in self.store.all_stats() if pair[0] in order and pair[1] in order),
                       key=lambda pair: (order[pair[0]], order[pair[1]]))  # fmt: skip
        rows = []
        for home, away in pairs:
            s = self.store.stats(home, away)
            rows.append(dict(home=home, away=away, games=s.games, wins=s.wins, draws=s.draws, losses=s.losses,
                             win_rate=self.payoff.win_rate(home, away)))  # fmt: skip
        return rows

    # ---------------------------------------------------------------- matches and outcomes

    def choose(self, player_id: str = MAIN_PLAYER, rng: RngLike = None, seat: Optional[int] = None) -> Match:
        """The opponent of ``player_id``'s next games (see the class docstring); self-play before any history.

        Args:
            player_id: An active player.
            rng: The generator to draw with (None: the league's).
            seat: The player's seat in these games (matchmaking ``nash`` draws from the other seat's mixture).

        Raises:
            KeyError: no such player. ValueError: a historical player.
        """
        with self._lock:
            player = self._active(player_id)
            return self.matchmaker.choose(player, self.store.players(), self._rng(rng), seat)

    def set_mixture(self, player_id: str, mixture: Mapping[str, Tuple[float, float]]) -> None:
        """The meta-game's Nash mixture of ``player_id``'s history, per historical id a weight per seat: what
        matchmaking ``nash`` (PSRO) draws opponents from."""
        with self._lock:
            self.matchmaker.mixtures[player_id] = {k: (float(v[0]), float(v[1])) for k, v in mixture.items()}

    def record(self, player_id: str, opponent_id: str, outcome: Result, key: Optional[str] = None) -> bool:
        """Count one game: both payoff directions and both Elo ratings, in one store transaction.

        Args:
            player_id: One side (the learner).
            opponent_id: The other (an active or historical player).
            outcome: ``player_id``'s result: +1, 0, -1 or 'win', 'draw', 'loss'.
            key: The outcome's unique key (an episode id): a second record with it counts nothing.

        Returns:
            Whether it was counted: False for a repeated key, and for a game against itself (self-play with its
            current parameters tells the payoff table nothing).

        Raises:
            KeyError: an unknown player. ValueError: a bad outcome.
        """
        score = (result_sign(outcome) + 1) / 2.0
        with self._lock:
            for known in (player_id, opponent_id):
                self.player(known)  # raises KeyError for an unknown (or forgotten) player
            if player_id == opponent_id or (key is not None and self.store.applied(key)):
                return False
            ratings = self.ratings()
            home, away = self.elo.update(ratings[player_id], ratings[opponent_id], score)
            stats = self.payoff.updated(player_id, opponent_id, outcome)
            change = Change(stats=stats, ratings={player_id: home, opponent_id: away}, key=key)
            return self.store.apply(change)

    # ---------------------------------------------------------------- snapshots

    def snapshot_due(self, player_id: str, step: int) -> bool:
        """Whether the active player, now at ``step``, should be frozen into history (the ``snapshot`` rules)."""
        rules = self.cfg["snapshot"]
        with self._lock:
            player = self._active(player_id)
            since = int(step) - player.last_frozen_step
            if since <= 0:
                return False
            if rules["every_steps"] is not None and since >= rules["every_steps"]:
                return True
            if since < rules["min_steps"]:
                return False
            opponents = self.matchmaker.snapshot_opponents(player, self.store.players())
            if not opponents:
                return False
            rates = self.payoff.win_rates(player_id, [q.player_id for q in opponents])
            return bool(rates.min() > rules["win_rate"])

    def freeze(self, player_id: str, snapshot_name: str, step: int, rng: RngLike = None) -> Tuple[str, bool]:
        """Add a historical copy of an active player (parameters in ``snapshot_name``, taken at ``step``).

        The copy starts with its parent's Elo. Call ``forget_old_history`` afterwards to apply ``keep_history``.

        Args:
            player_id: The active player.
            snapshot_name: Where its frozen parameters are stored.
            step: Its step now.
            rng: The generator of a league exploiter's reset draw (None: the league's).

        Returns:
            ``(historical_id, reset)``: the new player's id (``<player_id>@<step>``) and whether the active player
            must restart from its initial parameters (main exploiters always, league exploiters with probability
            ``league_exploiter_reset_prob``, main players never).
        """
        with self._lock:
            player = self._active(player_id)
            reset = player.kind == MAIN_EXPLOITER or (
                player.kind == LEAGUE_EXPLOITER and self._rng(rng).random() < self.cfg["league_exploiter_reset_prob"]
            )
            new_id, change = self._frozen(player, snapshot_name, int(step), reset)
            self.store.apply(change)
            return new_id, reset

    def _frozen(self, player: Player, snapshot_name: str, step: int, reset: bool) -> Tuple[str, Change]:
        taken = {p.player_id for p in self.store.players()}
        new_id = historical_id(player.player_id, step, taken)
        copy = Player(new_id, HISTORICAL, player.player_id, str(snapshot_name), step, time.time())
        active = dataclasses.replace(player, step=step, last_frozen_step=step, resets=player.resets + int(reset))
        ratings = {new_id: self.ratings()[player.player_id]}
        if reset:
            ratings[player.player_id] = self.elo.initial
        cleared = (player.player_id,) if reset else ()
        return new_id, Change(players=(copy, active), cleared=cleared, ratings=ratings)

    def forget_old_history(self, player_id: Optional[str] = MAIN_PLAYER) -> List[str]:
        """Forget the oldest history snapshots of ``player_id`` (None: of every player) beyond ``keep_history``,
        with their payoff rows and ratings; returns their storage names (delete the files)."""
        keep = self.cfg["keep_history"]
        if keep is None:
            return []
        with self._lock:
            parents = self.players() if player_id is None else [player_id]
            old = [p for parent in parents for p in self._history(parent)[: max(0, len(self._history(parent)) - keep)]]
            if old:
                self.store.apply(Change(removed=tuple(p.player_id for p in old)))
            return [p.snapshot for p in old]

    # ---------------------------------------------------------------- the parallel league manager's methods

    def current(self, player_id: str = MAIN_PLAYER) -> Optional[Snapshot]:
        """The active player's newest published snapshot (``add_snapshot``), or None before the first."""
        player = self._active(player_id)
        if player.snapshot is None:
            return None
        kept = any(h.snapshot == player.snapshot for h in self._history(player_id))
        return Snapshot(player.snapshot, player_id, player.step, kept)

    def add_snapshot(self, name: str, policy_iter: int, player_id: str = MAIN_PLAYER, history: bool = False) -> None:
        """Publish ``name`` as the active player's current parameters at step ``policy_iter``; with ``history``,
        also freeze it (as ``freeze`` does, without a reset; once per storage name)."""
        with self._lock:
            player = self._active(player_id)
            if history and not any(h.snapshot == name for h in self._history(player_id)):
                _, change = self._frozen(player, name, int(policy_iter), reset=False)
                active = dataclasses.replace(change.players[1], snapshot=str(name))
                change = dataclasses.replace(change, players=(change.players[0], active))
            else:
                change = Change(players=(dataclasses.replace(player, snapshot=str(name), step=int(policy_iter)),))
            self.store.apply(change)

    def wants_history(self, policy_iter: int, player_id: str = MAIN_PLAYER) -> bool:
        """Whether a snapshot at ``policy_iter`` should go into history: the player has none yet, or one is due."""
        return not self.history(player_id) or self.snapshot_due(player_id, policy_iter)

    def task_choice(self, player_id: str = MAIN_PLAYER, rng: RngLike = None) -> Optional[Dict[str, Any]]:
        """What the league manager posts for collect tasks: ``{player, snapshot, policy_iter, opponent}`` (the
        opponent's storage name, None for self-play); None before the player published a snapshot."""
        with self._lock:
            current = self.current(player_id)
            if current is None:
                return None
            match = self.choose(player_id, rng)
            return {
                "player": player_id,
                "snapshot": current.name,
                "policy_iter": current.policy_iter,
                "opponent": match.opponent_snapshot,
            }

    def _rng(self, rng: RngLike) -> np.random.Generator:
        if rng is None:
            return self.rng
        return rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)


def check_league_section(cfg: Dict[str, Any], where: str = "") -> None:
    """A ``ConfigParts`` check: the ``league`` section is a valid ``League`` config and its ``eval`` sub-section a
    valid serial league trainer's; both are written back resolved (every key with its default).

    Raises:
        ConfigError: the section is malformed (the message names the key).
    """
    section = cfg.get("league")
    if section is None:
        return
    if not isinstance(section, Mapping):
        raise ConfigError(f"key 'league'{where} expects a mapping, got {section!r}")
    resolved = resolve_league_config({k: v for k, v in section.items() if k != "eval"}, where=where)
    try:
        resolved["eval"] = resolve_eval_config(section.get("eval"))
    except ConfigError as error:
        raise ConfigError(f"{error}{where}") from None
    cfg["league"] = resolved


__all__ = ["League", "MAIN_PLAYER", "Match", "Snapshot", "check_league_section"]
