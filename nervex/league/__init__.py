"""The league (AlphaStar's, with DI-engine's names): players, payoff table, PFSP matchmaking, snapshots, ratings."""

from .config import DEFAULT_LEAGUE_CONFIG, MATCHMAKING, resolve_league_config
from .league import MAIN_PLAYER, League, Snapshot, check_league_section
from .matchmaking import MATCH_KINDS, Match, Matchmaker
from .payoff import Payoff, result_sign
from .pfsp import PFSP_WEIGHTINGS, pfsp
from .player import ACTIVE_KINDS, HISTORICAL, LEAGUE_EXPLOITER, MAIN, MAIN_EXPLOITER, PLAYER_KINDS, Player
from .rating import Elo
from .store import Change, LeagueStore, MemoryStore, PairStats, SQLiteStore

__all__ = [
    "ACTIVE_KINDS",
    "Change",
    "DEFAULT_LEAGUE_CONFIG",
    "Elo",
    "HISTORICAL",
    "LEAGUE_EXPLOITER",
    "League",
    "LeagueStore",
    "MAIN",
    "MAIN_EXPLOITER",
    "MAIN_PLAYER",
    "MATCH_KINDS",
    "MATCHMAKING",
    "Match",
    "Matchmaker",
    "MemoryStore",
    "PFSP_WEIGHTINGS",
    "PLAYER_KINDS",
    "PairStats",
    "Payoff",
    "Player",
    "SQLiteStore",
    "Snapshot",
    "check_league_section",
    "pfsp",
    "resolve_league_config",
    "result_sign",
]
