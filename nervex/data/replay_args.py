"""The ranges of a replay buffer's arguments (``BaseBuffer``), checked before anything is allocated."""

from __future__ import annotations

from typing import Optional


def check_replay_args(
    maxlen: int,
    alpha: float,
    beta: float,
    beta_anneal_steps: int,
    eps: float,
    max_use: Optional[int],
    max_staleness: Optional[int],
    samples_per_insert: Optional[float],
) -> None:
    """Refuse a replay buffer argument outside what it can mean, naming it and the valid range.

    Raises:
        ValueError: the first argument out of range.
    """
    checks = [
        (maxlen >= 1, f"maxlen must be >= 1, got {maxlen}"),
        (alpha >= 0, f"alpha must be >= 0 (0: uniform, 1: fully proportional), got {alpha}"),
        (0 <= beta <= 1, f"beta must be in [0, 1], got {beta}"),
        (beta_anneal_steps >= 0, f"beta_anneal_steps must be >= 0 (0: no annealing), got {beta_anneal_steps}"),
        (eps > 0, f"eps (the priority floor) must be > 0, got {eps}"),
        (max_use is None or max_use >= 1, f"max_use must be None or >= 1, got {max_use}"),
        (max_staleness is None or max_staleness >= 0, f"max_staleness must be None or >= 0, got {max_staleness}"),
        (
            samples_per_insert is None or samples_per_insert > 0,
            f"samples_per_insert must be > 0, got {samples_per_insert}",
        ),
    ]
    for ok, message in checks:
        if not ok:
            raise ValueError(message)


__all__ = ["check_replay_args"]
