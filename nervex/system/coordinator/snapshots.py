"""Which policy snapshot (and opponent) a collect task names: the ``SnapshotSource`` seam of the coordinator."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Protocol


@dataclass(frozen=True)
class SnapshotChoice:
    """The policy a new collect task names.

    Attributes:
        snapshot: Storage name of the policy weights; None: the actor's freshly initialised policy.
        policy_iter: The learner iteration the snapshot was taken at.
        opponent: Storage name of an opponent's weights (self-play; None for one player).
    """

    snapshot: Optional[str]
    policy_iter: int
    opponent: Optional[str] = None


class SnapshotSource(Protocol):
    """Chooses the snapshot of each new collect task (the league manager's job once it exists)."""

    def choose(self) -> SnapshotChoice:
        """The snapshot the next collect task names."""
        ...


class LatestLearnerSnapshot:
    """The default ``SnapshotSource``: the newest snapshot the learner reported on ``/v1/learner/progress``.

    Args:
        progress: Returns the learner's last progress report (``{}`` before the first).
    """

    def __init__(self, progress: Callable[[], Mapping[str, Any]]) -> None:
        self._progress = progress

    def choose(self) -> SnapshotChoice:
        """The learner's newest snapshot (None before its first report)."""
        report = self._progress()
        return SnapshotChoice(report.get("snapshot"), int(report.get("policy_iter", 0)))


class LeagueOrLearnerSnapshot:
    """The ``SnapshotSource`` of a run with a league manager: its choice while it is alive, else the learner's newest.

    The league manager posts its choice on ``/v1/league/update`` every ``system.league.poll_s``; a choice older than
    ``stale_s`` (the league manager died or hangs; restart it by hand or from the job script) falls back to the
    learner's newest snapshot, so collection never waits on the league.

    Args:
        league: Returns the league manager's last update (``{}`` before the first).
        latest: The fallback source.
        clock: Seconds (the coordinator's clock).
        stale_s: Age after which the league's choice is ignored.
    """

    def __init__(
        self,
        league: Callable[[], Mapping[str, Any]],
        latest: SnapshotSource,
        clock: Callable[[], float],
        stale_s: float,
    ) -> None:
        self._league = league
        self._latest = latest
        self._clock = clock
        self.stale_s = float(stale_s)

    def choose(self) -> SnapshotChoice:
        """The league's choice while it is fresh, else ``latest``'s."""
        update = self._league()
        choice = update.get("choice")
        if not choice or self._clock() - float(update.get("updated_at", 0.0)) > self.stale_s:
            return self._latest.choose()
        return SnapshotChoice(choice.get("snapshot"), int(choice.get("policy_iter", 0)), choice.get("opponent"))


__all__ = ["LatestLearnerSnapshot", "LeagueOrLearnerSnapshot", "SnapshotChoice", "SnapshotSource"]
