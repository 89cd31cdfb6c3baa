"""Back-pressure and task creation: whether a collect result may be recorded now, and how many collect tasks to create.

``TaskSupply`` is mixed into ``nervex.system.coordinator.state.CoordinatorState``: it reads the state's config
(``cfg``, ``settings``), its ``table``, ``run_state``, ``storage``, ``run_dir``, ``snapshot_source``, the collect
spec and ``learning_starts``, and its ``queued_results``, ``is_finished`` and ``learner_progress``. The limits
themselves are the pure functions of ``nervex.system.coordinator.backpressure``.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional

from nervex.system.comm.errors import ProtocolError
from nervex.system.coordinator import backpressure

RETRY_AFTER_S = 1.0
"""What a 429 or 507 tells the client to wait before sending again."""


class TaskSupply:
    """The back-pressure refusals and the collect-task top-up of ``CoordinatorState``."""

    # provided by CoordinatorState
    cfg: Any
    settings: Any
    table: Any
    run_state: Any
    storage: Any
    run_dir: str
    snapshot_source: Any
    hard_queued_results: int
    _collect: Any
    _learning_starts: int
    queued_results: Callable[[], int]
    is_finished: Callable[[], bool]
    learner_progress: Callable[[], Dict[str, Any]]

    def _refuse_if_backpressured(self, task_id: str) -> None:
        """429 while too many results wait for the learner, 507 while the disk is nearly full: nothing recorded."""
        queued = self.queued_results()
        if queued >= self.hard_queued_results:
            raise ProtocolError(
                429,
                f"{queued} collect results wait for the learner (system.coordinator.hard_queued_results = "
                f"{self.hard_queued_results}); task {task_id!r} not recorded: keep its data and send again",
                field="result",
                retry_after=RETRY_AFTER_S,
            )
        free = self._free_bytes()
        if free < self.settings.min_free_bytes:
            raise ProtocolError(
                507,
                f"{free} bytes free under the storage root or run dir, below system.coordinator.min_free_bytes = "
                f"{self.settings.min_free_bytes}; task {task_id!r} not recorded: keep its data and send again",
                field="result",
                retry_after=RETRY_AFTER_S,
            )

    def _free_bytes(self) -> int:
        return min(backpressure.free_bytes(self.storage.root), backpressure.free_bytes(self.run_dir))

    def _top_up(self) -> int:
        """Create the collect tasks the limits allow; returns how many."""
        if self.is_finished():
            return 0
        count = self._collect_budget()
        if count <= 0:
            return 0
        first = int(self.run_state.get("next_task_index", 0))
        self.run_state.put("next_task_index", first + count)  # before the tasks: a crash in between skips indices
        choice = self.snapshot_source.choose()
        payload = {
            "unit": self._collect.unit,
            "n": self._collect.n,
            "restart_envs": self._collect.restart_envs,
            "snapshot": choice.snapshot,
            "policy_iter": choice.policy_iter,
        }
        tasks = [(f"collect-{index:08d}", dict(payload, task_index=index)) for index in range(first, first + count)]
        self.table.add_tasks("collect", tasks)
        return count

    def _collect_budget(self) -> int:
        if self.queued_results() >= self.settings.max_queued_results:
            return 0
        if self._free_bytes() < self.settings.min_free_bytes:
            return 0
        pending = self.table.pending_count("collect")
        return backpressure.collect_budget(
            pending=pending,
            max_pending=self.settings.max_pending_collect,
            in_flight=pending + self.table.count(state="leased", kind="collect"),
            task_env_steps=self._task_env_steps(),
            accepted_env_steps=self.run_state.env_steps,
            max_env_step=self.cfg.max_env_step,
            insert_limit=self._insert_limit(),
        )

    def _insert_limit(self) -> Optional[float]:
        """Reverb's samples-per-insert limit on accepted plus in-flight env steps; None without one."""
        spi = self.settings.samples_per_insert
        if spi is None:
            return None
        learner = self.learner_progress()
        limit = self._learning_starts + learner.get("sampled", 0) / spi
        if learner.get("buffer_size") is not None:
            # Reverb's min_size_to_sample: a learner whose replay buffer holds fewer than learning_starts samples (a
            # restarted learner's is empty) is not held back by what it sampled before; it is refilled up to there
            deficit = max(0, self._learning_starts - int(learner["buffer_size"]))
            limit = max(limit, int(learner.get("env_step", 0)) + deficit)
        return limit

    def _task_env_steps(self) -> int:
        """Env steps one collect task takes: ``n`` samples, ``n`` steps of every env, or unknown (episodes)."""
        if self._collect.unit == "sample":
            return self._collect.n
        if self._collect.unit == "rollout":
            return self._collect.n * int(self.cfg.env.collector_env_num)
        return 0


__all__ = ["RETRY_AFTER_S", "TaskSupply"]
