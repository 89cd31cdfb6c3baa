"""The coordinator of the parallel mode, in layers.

* ``service``: ``Coordinator``, the process: opens the databases and storage, serves the routes, runs the background
  pass (lease expiry, task creation, the sweep of orphaned files).
* ``routes``: ``CoordinatorRoutes``, request checking: each route checks its JSON body and calls one transition.
* ``state``: ``CoordinatorState``, the transitions: registration, leases, results, the learner's progress, the
  league's choice, the end of the run, back-pressure (429/507 with Retry-After) and collect-task creation.
* ``snapshots``: which snapshot (and opponent) a collect task names (``SnapshotSource``).
* ``backpressure``: how many collect tasks fit (Reverb's samples-per-insert limit), free disk space.
* ``task_table`` and ``schema``: tasks, workers and leases in SQLite; ``run_state``: the coordinator's own state.

Import the public names from here: ``from nervex.system.coordinator import Coordinator``.
"""

from nervex.system.coordinator.backpressure import collect_budget, free_bytes
from nervex.system.coordinator.routes import CoordinatorRoutes
from nervex.system.coordinator.run_state import RunState
from nervex.system.coordinator.service import STATE_FILE, TABLE_FILE, Coordinator
from nervex.system.coordinator.snapshots import (
    LatestLearnerSnapshot,
    LeagueOrLearnerSnapshot,
    SnapshotChoice,
    SnapshotSource,
)
from nervex.system.coordinator.state import CoordinatorError, CoordinatorState
from nervex.system.coordinator.task_table import TaskTable, TaskTableError

__all__ = [
    "Coordinator",
    "CoordinatorError",
    "CoordinatorRoutes",
    "CoordinatorState",
    "LatestLearnerSnapshot",
    "LeagueOrLearnerSnapshot",
    "RunState",
    "STATE_FILE",
    "SnapshotChoice",
    "SnapshotSource",
    "TABLE_FILE",
    "TaskTable",
    "TaskTableError",
    "collect_budget",
    "free_bytes",
]
