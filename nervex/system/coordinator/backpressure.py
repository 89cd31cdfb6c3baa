"""Back-pressure of the parallel mode: how many new collect tasks fit (a Reverb-style samples-per-insert limit)."""

from __future__ import annotations

import math
import shutil
from typing import Optional


def collect_budget(
    pending: int,
    max_pending: int,
    in_flight: int,
    task_env_steps: int,
    accepted_env_steps: int,
    max_env_step: float,
    insert_limit: Optional[float],
) -> int:
    """How many collect tasks to create now.

    Args:
        pending: Collect tasks waiting for an actor.
        max_pending: The most that may wait.
        in_flight: Collect tasks pending or leased.
        task_env_steps: Env steps one task takes (0 when unknown: episodes).
        accepted_env_steps: Env steps of the accepted results.
        max_env_step: No task starts once accepted and in-flight steps reach it.
        insert_limit: ``learning_starts + sampled / samples_per_insert``; a task starts while accepted and in-flight
            steps are ``<=`` it. None: no rate limit.
    """
    budget = max(0, max_pending - pending)
    projected = accepted_env_steps + in_flight * task_env_steps
    budget = _tasks_that_fit(max_env_step - projected, task_env_steps, budget, inclusive=False)
    if insert_limit is not None:
        budget = _tasks_that_fit(insert_limit - projected, task_env_steps, budget, inclusive=True)
    return budget


def _tasks_that_fit(room: float, step: int, cap: int, inclusive: bool) -> int:
    """How many tasks of ``step`` env steps start while the steps projected before each stay below ``room``."""
    if room < 0 or (room == 0 and not inclusive):
        return 0
    if step <= 0 or math.isinf(room):
        return cap
    count = math.floor(room / step) + 1 if inclusive else math.ceil(room / step)
    return min(cap, count)


def free_bytes(path: str) -> int:
    """Free bytes on the file system holding ``path`` (patched by tests to simulate a full disk)."""
    return shutil.disk_usage(path).free
