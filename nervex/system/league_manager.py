"""The league manager role: keeps the league (players, snapshots) and tells the coordinator what collect tasks play.

Every ``system.league.poll_s`` it posts its current choice on ``/v1/league/update`` and gets the learner's progress
back; a new learner snapshot becomes the main player's current one (and, every ``history_every`` gradient steps, a
history copy under the storage kind ``league``). The coordinator hands each collect task the league's choice while the
league manager is alive and falls back to the learner's newest snapshot when it is not.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Mapping, Optional

from nervex.entry.builder import compile_parallel_config
from nervex.league import League
from nervex.system.comm.errors import ProtocolError
from nervex.system.comm.storage import Storage
from nervex.system.protocol import LEAGUE_UPDATE_PATH
from nervex.system.role import RoleLink
from nervex.system.system_config import storage_root

LEAGUE_FILE = "league.sqlite"


class LeagueManagerRole:
    """The league manager process.

    Args:
        cfg: The run's config.
        run_dir: The run directory (``league.sqlite`` lives there).
        worker_id: Its id at the coordinator.
        url: The coordinator's address; None: ``<run_dir>/coordinator.url``.
        logger: Where events go.
        token: The run's secret (tests).
    """

    def __init__(
        self,
        cfg: Mapping[str, Any],
        run_dir: str,
        worker_id: str,
        url: Optional[str] = None,
        logger: Optional[logging.Logger] = None,
        token: Optional[bytes] = None,
    ) -> None:
        self.cfg = compile_parallel_config(cfg)
        self.settings = self.cfg.system.league
        self.logger = logger or logging.getLogger(__name__)
        os.makedirs(run_dir, exist_ok=True)
        # one main player playing its own current snapshot; history every ``history_every`` learner iterations
        league_cfg = {
            "matchmaking": "self_play",
            "keep_history": int(self.settings.keep_history),
            "snapshot": {"every_steps": int(self.settings.history_every)},
        }
        self.league = League.open(os.path.join(run_dir, LEAGUE_FILE), league_cfg)
        self.storage = Storage(storage_root(self.cfg, run_dir), min_free_bytes=0)
        self.link = RoleLink(self.cfg, run_dir, "league_manager", worker_id, url=url, token=token, logger=self.logger)
        self.updates = 0

    def run(self, stop: Optional[Any] = None) -> None:
        """Post the choice and follow the learner until the run finishes or ``stop`` is set."""
        if stop is not None:
            self.link.stop_requested = stop.is_set
        self.link.register()
        try:
            while not self.link.stopping.is_set() and not (stop is not None and stop.is_set()):
                self.step()
                time.sleep(float(self.settings.poll_s))
        finally:
            self.close()

    def step(self) -> None:
        """One exchange with the coordinator: post the choice, then record a new learner snapshot."""
        answer = self.link.call_registered(LEAGUE_UPDATE_PATH, {"choice": self.league.task_choice()})
        self.updates += 1
        learner = answer.get("learner") or {}
        name = learner.get("snapshot")
        if not name:
            return
        current = self.league.current()
        if current is not None and current.name == name:
            return
        policy_iter = int(learner.get("policy_iter", 0))
        self.league.add_snapshot(name, policy_iter)
        if self.league.wants_history(policy_iter):
            self._keep_history(name, policy_iter)
        # post the new choice at once: a new snapshot should reach the next collect task without a poll period
        self.link.call_registered(LEAGUE_UPDATE_PATH, {"choice": self.league.task_choice()})

    def _keep_history(self, name: str, policy_iter: int) -> None:
        try:
            copy = self.storage.put(self.storage.get(name), "league")
        except ProtocolError as error:  # the learner already replaced it: the next one will do
            self.logger.info("history snapshot at iteration %d skipped: %s", policy_iter, error)
            return
        self.league.add_snapshot(copy, policy_iter, history=True)
        self.league.add_snapshot(name, policy_iter)  # the learner's file stays the current one
        for old in self.league.forget_old_history():
            self.storage.delete(old)
        self.logger.info("history snapshot of the main player at iteration %d: %s", policy_iter, copy)

    def close(self) -> None:
        self.link.close()
        self.league.close()


__all__ = ["LeagueManagerRole", "LEAGUE_FILE"]
