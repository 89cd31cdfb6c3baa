"""The league: players, their snapshots, and which snapshot each collect task plays (``League``)."""

from .league import MAIN_PLAYER, League, Snapshot

__all__ = ["League", "MAIN_PLAYER", "Snapshot"]
