"""``nervex plot``: learning curves of runs from their ``eval.csv``, grouped across seeds, with an IQM summary.

::

    nervex plot runs/                                   # every run under runs/, grouped by config -> curves.png
    nervex plot runs/a runs/b runs/c --out dqn.svg --x wall_time --group-by name --ci 90 --last 5

A RUN_DIR is a folder holding ``eval.csv`` or ``config.yaml`` (a serial run, or a parallel run's directory: the
learner writes the same two files there); any other folder stands for every run folder below it. Runs are grouped
(``--group-by config``: the same resolved ``config.yaml`` apart from ``seed`` and ``exp_name``; ``name``: the same
folder name once its seed and time-stamp parts are removed; ``none``: one group per run); each group is drawn as the
mean of its runs' evaluation curves (``mean_reward`` against ``env_step`` or ``wall_time``, interpolated onto the
range every run of the group covers; with ``--hold-last`` a run that stopped early, at ``evaluator.stop_val``, holds
its last evaluation up to the longest run), a percentile bootstrap band of that mean across seeds and, thin, the runs.
The table printed and written to ``<out stem>_summary.csv`` gives per group the IQM (rliable's), median and mean of
the runs' final scores (the mean of each run's last ``--last`` evaluations), IQM and mean with bootstrap intervals.

A run with no evaluation yet (no ``eval.csv``, or only its header) is an error when it is the only run, and is
skipped with a warning on stderr when other runs remain. Reading and grouping runs is ``nervex.tools.runs``, the
statistics ``nervex.tools.curves``.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Tuple

from .curves import (
    DEFAULT_CI,
    DEFAULT_POINTS,
    DEFAULT_RESAMPLES,
    GroupCurve,
    ScoreSummary,
    final_score,
    format_summary,
    group_curve,
    summarize_scores,
    summary_path,
    write_summary_csv,
)
from .runs import GROUP_BY, PlotError, Run, find_run_dirs, group_runs, read_runs

X_COLUMNS = ("env_step", "wall_time")
X_LABELS = {"env_step": "env steps", "wall_time": "wall time (s)"}
FORMATS = (".png", ".svg")


@dataclass
class PlotGroup:
    """A group of runs: its curve (mean, band, runs on a grid) and the summary of its final scores."""

    curve: GroupCurve
    summary: ScoreSummary
    runs: List[Run] = field(default_factory=list)
    final_scores: List[float] = field(default_factory=list)


# ---- curves and summary -----------------------------------------------------------------------------------------------
def compute_groups(
    run_dirs: Sequence[str],
    x: str = "env_step",
    group_by: str = "config",
    metric: str = "mean_reward",
    ci: float = DEFAULT_CI,
    n_resamples: int = DEFAULT_RESAMPLES,
    last: int = 3,
    n_points: int = DEFAULT_POINTS,
    seed: int = 0,
    hold_last: bool = False,
) -> List[PlotGroup]:
    """The data a figure and its summary show: per group the runs on a common grid, their mean and bootstrap band,
    and the summary of their final scores.

    Args:
        run_dirs: Run directories or folders of them (``find_run_dirs``).
        x: ``env_step`` or ``wall_time``.
        group_by: ``config``, ``name`` or ``none`` (``group_runs``).
        metric: The ``eval.csv`` column on the y axis.
        ci: Coverage of the bands and intervals, in percent.
        n_resamples: Bootstrap resamples.
        last: A run's final score is the mean of its last ``last`` evaluations.
        n_points: Evenly spaced grid points per group (the runs' own x values are added).
        seed: Seed of the bootstrap RNG (fixed: the same figure on every call).
        hold_last: Extend each run past its last evaluation with its last value, up to the group's longest run
            (runs that stopped on reaching ``evaluator.stop_val``); default: only the range all runs cover.

    Raises:
        PlotError: bad arguments, no usable run, or a group whose runs share no x range.
    """
    if x not in X_COLUMNS:
        raise PlotError(f"--x {x!r}: expected one of {', '.join(X_COLUMNS)}")
    if not 0 < ci < 100:
        raise PlotError(f"--ci {ci}: expected a percentage strictly between 0 and 100")
    if n_resamples < 1 or last < 1 or n_points < 2:
        raise PlotError(f"--bootstrap {n_resamples}, --last {last} and the grid's {n_points} points must be positive")
    runs = read_runs(find_run_dirs(run_dirs), x, metric)
    out = []
    for label, members in group_runs(runs, group_by):
        names = [r.name for r in members]
        try:
            curve = group_curve(label, [(r.x, r.y) for r in members], names, n_points, ci, n_resamples, seed, hold_last)
        except ValueError as e:
            raise PlotError(f"group {label!r} ({', '.join(names)}): {e}") from None
        scores = [final_score(r.y, last) for r in members]
        out.append(PlotGroup(curve, summarize_scores(label, scores, ci, n_resamples, seed), list(members), scores))
    return out


# ---- drawing ----------------------------------------------------------------------------------------------------------
def draw_curves(
    curves: Sequence[GroupCurve],
    out: str,
    xlabel: str = X_LABELS["env_step"],
    ylabel: str = "evaluation mean return",
    title: Optional[str] = None,
    show_runs: bool = True,
    hlines: Sequence[Tuple[float, str]] = (),
    caption: Optional[str] = None,
    colors: Optional[Sequence[str]] = None,
    figsize: Tuple[float, float] = (7.0, 4.2),
    dpi: int = 110,
    legend_loc: str = "best",
    run_word: str = "run",
) -> None:
    """Draw each group's mean line, its band (filled) and, thin, its runs; write a PNG or SVG (by extension).

    Args:
        curves: The groups (``curves.group_curve``).
        out: ``.png`` or ``.svg`` path.
        xlabel, ylabel, title: Axis labels and title.
        show_runs: Draw each run as a thin line.
        hlines: ``(y, label)`` dashed horizontal lines (a threshold).
        caption: Small grey text under the axes.
        colors: One matplotlib colour per group (default: the tab10 cycle).
        figsize, dpi: Figure size in inches and PNG resolution.
        legend_loc: Where the legend goes (matplotlib's ``loc``).
        run_word: What the legend counts (``nervex (5 seeds)`` with ``seed``).

    Raises:
        PlotError: ``out`` has another extension, or matplotlib is not installed.
    """
    if os.path.splitext(out)[1].lower() not in FORMATS:
        raise PlotError(f"--out {out}: expected a {' or '.join(FORMATS)} file")
    try:
        import matplotlib
    except ImportError:
        raise PlotError("nervex plot needs matplotlib: pip install nervex[plot]") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=figsize)
    for i, c in enumerate(curves):
        color = colors[i] if colors else f"C{i % 10}"
        if show_runs:
            for values in c.values:
                ax.plot(c.grid, values, color=color, linewidth=0.6, alpha=0.45)
        runs = f"{len(c.run_names)} {run_word}{'s' if len(c.run_names) != 1 else ''}"
        marker = "o" if len(c.grid) == 1 else None  # a lone evaluation would draw no line
        ax.plot(c.grid, c.mean, color=color, linewidth=1.6, marker=marker, label=f"{c.label} ({runs})")
        ax.fill_between(c.grid, c.low, c.high, color=color, alpha=0.25, linewidth=0)
    for y, label in hlines:
        ax.axhline(y, color="gray", linestyle="--", linewidth=1, label=label)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc=legend_loc, fontsize=8)
    if caption:
        fig.text(0.01, 0.01, caption, fontsize=7, color="gray")
    fig.tight_layout(rect=(0, 0.03 if caption else 0, 1, 1))
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    fig.savefig(out, dpi=dpi)
    plt.close(fig)


# ---- the command ------------------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="nervex plot",
        description="Learning curves from runs' eval.csv: mean and bootstrap band across seeds, IQM summary.",
        epilog="example: nervex plot runs/ --out curves.svg --x wall_time",
    )
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories, or folders of them (runs/)")
    parser.add_argument("--out", default="curves.png", help="figure, .png or .svg (default: curves.png); the summary "
                        "goes to <stem>_summary.csv next to it")  # fmt: skip
    parser.add_argument("--x", default="env_step", choices=X_COLUMNS, help="x axis (default: env_step)")
    parser.add_argument("--group-by", default="config", choices=GROUP_BY, help="config: same config.yaml but for "
                        "seed and exp_name (default); name: same folder name but for seed and time; none: each run")  # fmt: skip
    parser.add_argument("--metric", default="mean_reward", help="eval.csv column to plot (default: mean_reward)")
    parser.add_argument("--ci", type=float, default=DEFAULT_CI, help="band and interval coverage, %% (default: 95)")
    parser.add_argument("--bootstrap", type=int, default=DEFAULT_RESAMPLES, help="bootstrap resamples (default 2000)")
    parser.add_argument("--last", type=int, default=3, help="final score: mean of the last N evaluations (default 3)")
    parser.add_argument("--no-runs", action="store_true", help="draw only the means and bands, not each run")
    parser.add_argument("--hold-last", action="store_true", help="hold each run's last evaluation up to the group's "
                        "longest run (runs stopped at evaluator.stop_val); default: the range all runs cover")  # fmt: skip
    parser.add_argument("--title", default=None, help="figure title")
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    """``nervex plot``: returns 0, or 2 after printing what is wrong."""
    args = build_parser().parse_args(argv)
    try:
        groups = compute_groups(
            args.run_dirs,
            args.x,
            args.group_by,
            args.metric,
            args.ci,
            args.bootstrap,
            args.last,
            hold_last=args.hold_last,
        )
        caption = f"mean and {args.ci:g}% percentile bootstrap band over runs ({args.bootstrap} resamples)"
        if args.hold_last:
            caption += "; a run holds its last evaluation after it"
        ylabel = "evaluation mean return" if args.metric == "mean_reward" else f"evaluation {args.metric}"
        draw_curves(
            [g.curve for g in groups], args.out, X_LABELS[args.x], ylabel, args.title, not args.no_runs, caption=caption
        )
    except PlotError as e:
        print(f"nervex plot: error: {e}", file=sys.stderr)
        return 2
    summaries = [g.summary for g in groups]
    write_summary_csv(summaries, summary_path(args.out))
    print(format_summary(summaries, args.ci, args.last))
    print(f"wrote {args.out} and {summary_path(args.out)}")
    return 0


__all__ = ["FORMATS", "X_COLUMNS", "PlotError", "PlotGroup", "compute_groups", "draw_curves", "main"]
