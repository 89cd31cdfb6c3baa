"""The statistics behind ``nervex plot``: learning curves on a common grid, a bootstrap band of their mean across
seeds, and rliable's interquartile mean (IQM) of the runs' final scores with a bootstrap interval.

Plain NumPy: no matplotlib, no run directories (``nervex.tools.runs`` reads those, ``nervex.tools.plot`` draws), so
``bench/zoo.py`` and tests use the same numbers the figures show.

* ``iqm``: rliable's ``aggregate_iqm``, which is ``scipy.stats.trim_mean(scores, 0.25)``: sort, drop
  ``floor(n / 4)`` scores at each end, average the rest (3 runs: none dropped; 5: one each end).
* ``mean_band``: the mean of the curves and a percentile bootstrap interval of that mean (runs resampled with
  replacement, a fixed RNG seed so a figure is the same on every re-render).
* ``group_curve``: a group's runs interpolated onto one grid, its mean and band.
* ``summarize_scores``: IQM, median and mean of the final scores, IQM and mean with bootstrap intervals;
  ``format_summary`` and ``write_summary_csv`` print and save them.
"""

from __future__ import annotations

import csv
import os
from dataclasses import astuple, dataclass
from typing import Any, Callable, Dict, List, Sequence, Tuple

import numpy as np

DEFAULT_CI = 95.0
DEFAULT_RESAMPLES = 2000
DEFAULT_POINTS = 200


def iqm(scores: Sequence[float]) -> float:
    """The interquartile mean as rliable computes it (``scipy.stats.trim_mean(scores, 0.25)``).

    The ``k = floor(0.25 * n)`` lowest and ``k`` highest scores are dropped and the rest averaged; no fractional
    weights: with ``n`` not divisible by 4 fewer than a quarter are dropped at each end (n = 3: k = 0, the plain
    mean; n = 5: k = 1, the mean of the middle 3).

    Raises:
        ValueError: no scores.
    """
    values = np.sort(np.asarray(scores, dtype=np.float64).ravel())
    if values.size == 0:
        raise ValueError("iqm of no scores")
    cut = int(0.25 * values.size)
    return float(values[cut : values.size - cut].mean())


def resample_indices(n: int, n_resamples: int, seed: int) -> np.ndarray:
    """Indices of ``n_resamples`` bootstrap resamples of ``n`` runs (with replacement), shape ``(n_resamples, n)``."""
    return np.random.default_rng(seed).integers(0, n, size=(n_resamples, n))


def _tails(ci: float) -> Tuple[float, float]:
    if not 0.0 < ci < 100.0:
        raise ValueError(f"confidence level must be in (0, 100) percent, got {ci}")
    tail = (100.0 - ci) / 2.0
    return tail, 100.0 - tail


def mean_band(
    values: np.ndarray, ci: float = DEFAULT_CI, n_resamples: int = DEFAULT_RESAMPLES, seed: int = 0
) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean over runs and a percentile bootstrap confidence band of that mean, point by point.

    Each resample draws ``n_runs`` runs with replacement (the same draw at every grid point, so a resample is a whole
    curve); the band is the ``(100 - ci) / 2`` and ``(100 + ci) / 2`` percentiles of the resampled means. With 3 runs
    and ``ci=95`` it is ``[min, max]`` of the runs (1/27 of the resamples draw one run three times, more than 2.5%).

    Args:
        values: One curve per run on a common grid.
        ci: Coverage of the band in percent.
        n_resamples: Bootstrap resamples.
        seed: Seed of the resampling RNG.

    Returns:
        ``(mean, low, high)``.

    Shapes:
        values: ``(n_runs, n_points)``; each output: ``(n_points,)``.
    """
    values = np.asarray(values, dtype=np.float64)
    if values.ndim != 2 or values.shape[0] == 0:
        raise ValueError(f"mean_band needs values of shape (n_runs >= 1, n_points), got {values.shape}")
    low_q, high_q = _tails(ci)
    means = values[resample_indices(values.shape[0], n_resamples, seed)].mean(axis=1)
    low, high = np.percentile(means, [low_q, high_q], axis=0)
    return values.mean(axis=0), low, high


def bootstrap_interval(
    scores: Sequence[float],
    statistic: Callable[[np.ndarray], float],
    ci: float = DEFAULT_CI,
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> Tuple[float, float]:
    """Percentile bootstrap interval of ``statistic`` over ``scores`` (one per run, resampled with replacement)."""
    values = np.asarray(scores, dtype=np.float64).ravel()
    low_q, high_q = _tails(ci)
    stats = [statistic(values[idx]) for idx in resample_indices(values.size, n_resamples, seed)]
    low, high = np.percentile(stats, [low_q, high_q])
    return float(low), float(high)


def interpolate(x: np.ndarray, y: np.ndarray, grid: np.ndarray, hold_last: bool = False) -> np.ndarray:
    """A curve linearly interpolated onto ``grid``: NaN before its first point, and after its last one unless
    ``hold_last`` (then its last value: a run stopped at a threshold keeps its last evaluation)."""
    x, y, grid = (np.asarray(a, dtype=np.float64) for a in (x, y, grid))
    out = np.full(grid.shape, np.nan)
    if x.size == 0:
        return out
    inside = (grid >= x[0]) & (hold_last | (grid <= x[-1]))
    out[inside] = np.interp(grid[inside], x, y)
    return out


def common_grid(xs: Sequence[np.ndarray], n_points: int = DEFAULT_POINTS, hold_last: bool = False) -> np.ndarray:
    """The x values at which a group's runs are compared: ``n_points`` evenly spaced over the range every run covers
    (from the latest first point to the earliest last point; to the latest last point with ``hold_last``), merged
    with the runs' own x values in that range, so the mean passes through each evaluation.

    Raises:
        ValueError: no runs, a run with no points, or runs whose ranges do not overlap.
    """
    if not xs or any(len(x) == 0 for x in xs):
        raise ValueError("common_grid needs at least one run, each with at least one point")
    start = max(float(x[0]) for x in xs)
    end = max(float(x[-1]) for x in xs) if hold_last else min(float(x[-1]) for x in xs)
    if end < start:
        raise ValueError(
            f"the runs cover no common x range (the latest starts at {start:g}, the earliest ends at {end:g})"
        )
    own = np.concatenate([np.asarray(x, dtype=np.float64) for x in xs])
    own = own[(own >= start) & (own <= end)]
    return np.unique(np.concatenate([np.linspace(start, end, n_points), own]))


@dataclass
class GroupCurve:
    """A group's curves on one grid with their mean and bootstrap band (what a figure draws for the group).

    Shapes:
        grid, mean, low, high: ``(n_points,)``; values: ``(n_runs, n_points)``.
    """

    label: str
    run_names: List[str]
    grid: np.ndarray
    values: np.ndarray
    mean: np.ndarray
    low: np.ndarray
    high: np.ndarray


def group_curve(
    label: str,
    curves: Sequence[Tuple[np.ndarray, np.ndarray]],
    run_names: Sequence[str],
    n_points: int = DEFAULT_POINTS,
    ci: float = DEFAULT_CI,
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
    hold_last: bool = False,
) -> GroupCurve:
    """The runs ``curves`` (``(x, y)`` each, x increasing) on their ``common_grid``, their mean and band."""
    grid = common_grid([x for x, _ in curves], n_points, hold_last)
    values = np.stack([interpolate(x, y, grid, hold_last) for x, y in curves])
    mean, low, high = mean_band(values, ci, n_resamples, seed)
    return GroupCurve(label, list(run_names), grid, values, mean, low, high)


def final_score(y: Sequence[float], last: int = 3) -> float:
    """A run's final score: the mean of its last ``last`` evaluations (all of them when it has fewer)."""
    if last < 1:
        raise ValueError(f"final_score needs last >= 1, got {last}")
    values = np.asarray(y, dtype=np.float64)
    if values.size == 0:
        raise ValueError("final_score of a run with no evaluation")
    return float(values[-last:].mean())


@dataclass
class ScoreSummary:
    """A group's final scores summarized as rliable reports them (IQM with its interval), plus median and mean."""

    label: str
    n_runs: int
    iqm: float
    iqm_low: float
    iqm_high: float
    median: float
    mean: float
    mean_low: float
    mean_high: float


def summarize_scores(
    label: str, scores: Sequence[float], ci: float = DEFAULT_CI, n_resamples: int = DEFAULT_RESAMPLES, seed: int = 0
) -> ScoreSummary:
    """IQM, median and mean of a group's final scores; IQM and mean with percentile bootstrap intervals."""
    values = np.asarray(scores, dtype=np.float64).ravel()
    iqm_low, iqm_high = bootstrap_interval(values, iqm, ci, n_resamples, seed)
    mean_low, mean_high = bootstrap_interval(values, lambda v: float(v.mean()), ci, n_resamples, seed)
    return ScoreSummary(
        label,
        int(values.size),
        iqm(values),
        iqm_low,
        iqm_high,
        float(np.median(values)),
        float(values.mean()),
        mean_low,
        mean_high,
    )


SUMMARY_FIELDS = ["group", "runs", "iqm", "iqm_low", "iqm_high", "median", "mean", "mean_low", "mean_high"]


def summary_rows(summaries: Sequence[ScoreSummary]) -> List[Dict[str, Any]]:
    """The summaries as ``SUMMARY_FIELDS`` dicts (the rows of the summary CSV)."""
    return [dict(zip(SUMMARY_FIELDS, astuple(s))) for s in summaries]


def format_summary(summaries: Sequence[ScoreSummary], ci: float = DEFAULT_CI, last: int = 3) -> str:
    """The summary as an aligned text table (what ``nervex plot`` prints)."""
    head = ["group", "runs", f"IQM [{ci:g}% CI]", "median", f"mean [{ci:g}% CI]"]
    body = [
        [s.label, str(s.n_runs), f"{s.iqm:.2f} [{s.iqm_low:.2f}, {s.iqm_high:.2f}]", f"{s.median:.2f}",
         f"{s.mean:.2f} [{s.mean_low:.2f}, {s.mean_high:.2f}]"]
        for s in summaries
    ]  # fmt: skip
    widths = [max(len(r[i]) for r in [head] + body) for i in range(len(head))]
    lines = [
        "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
        for r in [head] + body
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return f"final score: mean of each run's last {last} evaluations\n" + "\n".join(lines)


def write_summary_csv(summaries: Sequence[ScoreSummary], path: str) -> None:
    """The summaries as a CSV file, one row per group."""
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=SUMMARY_FIELDS)
        writer.writeheader()
        writer.writerows(summary_rows(summaries))


def summary_path(out: str) -> str:
    """Where the summary CSV goes: ``curves.png`` -> ``curves_summary.csv``."""
    return f"{os.path.splitext(out)[0]}_summary.csv"


__all__ = [
    "SUMMARY_FIELDS",
    "GroupCurve",
    "ScoreSummary",
    "bootstrap_interval",
    "common_grid",
    "final_score",
    "format_summary",
    "group_curve",
    "interpolate",
    "iqm",
    "mean_band",
    "resample_indices",
    "summarize_scores",
    "summary_path",
    "summary_rows",
    "write_summary_csv",
]
