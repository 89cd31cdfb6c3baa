"""Run directories for ``nervex plot``: find them, read their ``eval.csv`` and ``config.yaml``, group their seeds.

A run directory holds ``eval.csv`` or ``config.yaml``: a serial run's (``runs/<env>__<policy>__<seed>__<time>/``) or a
parallel run's (the learner writes both into the launch's run directory, next to ``logs/`` and ``storage/``).
"""

from __future__ import annotations

import csv
import json
import os
import re
import sys
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import yaml

from nervex.system.system_config import LOCAL_KEYS

GROUP_BY = ("config", "name", "none")
RUN_ONLY_KEYS = ("seed", "exp_name")
"""Top-level config keys that differ between the seeds of one experiment: ignored by ``--group-by config``."""
_TIME_STAMP = re.compile(r"^\d{8}-\d{6}$")
_CONFIG_HASH = re.compile(r"^[0-9a-f]{8}$")


class PlotError(Exception):
    """A run directory or an argument ``nervex plot`` cannot use; the message names it."""


@dataclass
class Run:
    """One run's evaluations: ``x`` increasing, ``y`` the metric at each."""

    path: str
    name: str
    config: Optional[Dict[str, Any]]
    x: np.ndarray
    y: np.ndarray


# ---- run directories --------------------------------------------------------------------------------------------------
def is_run_dir(path: str) -> bool:
    """Whether ``path`` holds a run's ``eval.csv`` or ``config.yaml``."""
    return any(os.path.isfile(os.path.join(path, f)) for f in ("eval.csv", "config.yaml"))


def find_run_dirs(paths: Sequence[str]) -> List[str]:
    """The run directories named by ``paths``: each one itself if it is a run directory, else every run directory
    below it (not descending into a run directory), sorted; duplicates removed in order.

    Raises:
        PlotError: a path is not a directory, or has no run directory below it.
    """
    found: List[str] = []
    for path in paths:
        if not os.path.isdir(path):
            raise PlotError(f"{path}: no such directory (give run directories or folders of them, e.g. runs/)")
        if is_run_dir(path):
            found.append(path)
            continue
        below = []
        for root, dirs, _ in os.walk(path):
            dirs.sort()
            if is_run_dir(root):
                below.append(root)
                dirs[:] = []
        if not below:
            raise PlotError(f"{path}: no run directory (one holding eval.csv or config.yaml) in it or below it")
        found += below
    return list(dict.fromkeys(os.path.normpath(p) for p in found))


def _ordered_rows(rows: List[Tuple[float, float]]) -> List[Tuple[float, float]]:
    """Rows with increasing x: a resumed run appends rows from its checkpoint's step, which replace the later ones
    of the first attempt."""
    out: List[Tuple[float, float]] = []
    for x, y in rows:
        while out and out[-1][0] >= x:
            out.pop()
        out.append((x, y))
    return out


def read_run(run_dir: str, x: str = "env_step", metric: str = "mean_reward") -> Run:
    """A run's ``eval.csv`` (``x`` and ``metric`` columns) and ``config.yaml`` (None when absent).

    ``wall_time`` restarts at 0 when a run is resumed; it is made cumulative (the time before the restart added).

    Raises:
        PlotError: no ``eval.csv``, no evaluation in it, a missing column or a value that is not a number.
    """
    path = os.path.join(run_dir, "eval.csv")
    if not os.path.isfile(path):
        raise PlotError(f"{run_dir}: no eval.csv (not a run directory, or the run has not evaluated yet)")
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        table = list(reader)
        columns = reader.fieldnames or []
    for column in (x, metric):
        if column not in columns:
            raise PlotError(f"{path}: no column {column!r} (columns: {', '.join(columns) or 'none'})")
    if not table:
        raise PlotError(f"{path}: no evaluation yet (only the header)")
    rows = []
    offset, previous = 0.0, -np.inf
    for i, row in enumerate(table, start=2):
        try:
            xv, yv = float(row[x]), float(row[metric])
        except (TypeError, ValueError):
            raise PlotError(f"{path} line {i}: {x}={row[x]!r}, {metric}={row[metric]!r} are not both numbers") from None
        if x == "wall_time":
            if xv + offset < previous:
                offset = previous
            xv += offset
            previous = xv
        if np.isfinite(yv):
            rows.append((xv, yv))
    if not rows:
        raise PlotError(f"{path}: no finite {metric} value")
    xs, ys = zip(*_ordered_rows(rows))
    return Run(run_dir, os.path.basename(os.path.normpath(run_dir)), _read_config(run_dir), np.array(xs), np.array(ys))


def _read_config(run_dir: str) -> Optional[Dict[str, Any]]:
    path = os.path.join(run_dir, "config.yaml")
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            cfg = yaml.safe_load(f)
    except yaml.YAMLError as e:
        raise PlotError(f"{path}: not readable YAML ({e})") from None
    if not isinstance(cfg, dict):
        raise PlotError(f"{path}: not a mapping of config keys")
    return cfg


def read_runs(run_dirs: Sequence[str], x: str = "env_step", metric: str = "mean_reward") -> List[Run]:
    """``read_run`` of each directory; with several, one that cannot be read is skipped with a warning on stderr.

    Raises:
        PlotError: the only run cannot be read, or none can.
    """
    if len(run_dirs) == 1:
        return [read_run(run_dirs[0], x, metric)]
    runs, problems = [], []
    for run_dir in run_dirs:
        try:
            runs.append(read_run(run_dir, x, metric))
        except PlotError as e:
            problems.append(str(e))
    if not runs:
        raise PlotError("no run to plot:\n  " + "\n  ".join(problems))
    for problem in problems:
        print(f"nervex plot: skipping {problem}", file=sys.stderr)
    return runs


# ---- grouping ---------------------------------------------------------------------------------------------------------
def strip_run_name(name: str, seed: Optional[int] = None) -> str:
    """A run folder's name without its seed, config-hash and time-stamp parts, so the seeds of one experiment share
    it: ``CartPole-v1__dqn__3__20261128-091156`` (serial) and ``CartPole-v1__dqn__3__1f2e3d4c__20261128-091156``
    (parallel: the hash covers the seed) -> ``CartPole-v1__dqn``.

    Parts are split at ``__``; a part ``<seed>``, ``seed<seed>`` or ``s<seed>`` (any number when ``seed`` is None)
    is the seed, an 8-hex-digit part right after it the config hash, and a trailing ``_seed<seed>``, ``-s<seed>``
    (...) of a part is removed too.
    """
    number = str(seed) if seed is not None else r"\d+"
    seed_part = re.compile(rf"^(seed|s)?{number}$")
    seed_suffix = re.compile(rf"[_-](seed|s){number}$")
    kept: List[str] = []
    after_seed = False
    for part in name.split("__"):
        is_seed = bool(seed_part.match(part))
        if not (is_seed or _TIME_STAMP.match(part) or (after_seed and _CONFIG_HASH.match(part))):
            kept.append(seed_suffix.sub("", part))
        after_seed = is_seed
    return "__".join(p for p in kept if p) or name


def comparable_config(cfg: Mapping[str, Any]) -> Dict[str, Any]:
    """The config without what differs between the seeds of one experiment: ``RUN_ONLY_KEYS``, and in a parallel
    run's ``system`` section the per-process addresses and mount points (``LOCAL_KEYS``: host, port, root)."""
    out = {k: v for k, v in cfg.items() if k not in RUN_ONLY_KEYS}
    if isinstance(out.get("system"), Mapping):
        out["system"] = {
            name: {k: v for k, v in section.items() if k not in LOCAL_KEYS} if isinstance(section, Mapping) else section
            for name, section in out["system"].items()
        }
    return out


def config_key(cfg: Mapping[str, Any]) -> str:
    """``comparable_config`` as a canonical string: equal for the seeds of one experiment."""
    return json.dumps(comparable_config(cfg), sort_keys=True, default=str)


def _flatten(cfg: Any, prefix: str = "") -> Dict[str, Any]:
    if isinstance(cfg, Mapping):
        out: Dict[str, Any] = {}
        for k, v in cfg.items():
            out.update(_flatten(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: cfg}


def config_label(cfg: Mapping[str, Any]) -> str:
    """``<env> <policy>``: the env's id (or type) and the policy type; ``, parallel`` added for a parallel run's
    config (it has a ``system`` section)."""
    env, policy = cfg.get("env") or {}, cfg.get("policy") or {}
    mode = ", parallel" if "system" in cfg else ""
    return f"{env.get('env_id') or env.get('env_type', '?')} {policy.get('policy_type', '?')}{mode}"


def distinguishing_keys(flat: Sequence[Mapping[str, Any]]) -> List[str]:
    """Few dotted keys whose values tell the flattened configs apart, chosen greedily: each pick separates the most
    pairs of configs not yet told apart (ties: run-defining sections before ``logger``/``system``, then by name)."""
    values = {k: [json.dumps(f.get(k), sort_keys=True, default=str) for f in flat] for k in set().union(*flat)}
    pairs = {(i, j) for i in range(len(flat)) for j in range(i + 1, len(flat))}
    chosen: List[str] = []
    while pairs:
        splits = {k: sum(v[i] != v[j] for i, j in pairs) for k, v in values.items() if k not in chosen}
        best = min(splits, key=lambda k: (-splits[k], k.split(".")[0] in ("logger", "system"), k), default=None)
        if best is None or splits[best] == 0:
            break
        chosen.append(best)
        pairs = {(i, j) for i, j in pairs if values[best][i] == values[best][j]}
    return chosen


def _config_labels(configs: Sequence[Mapping[str, Any]]) -> List[str]:
    """``config_label`` of each group's config; groups that share one get the keys that tell them apart appended
    (``CartPole-v1 dqn (policy.learn.learning_rate=0.001)``)."""
    base = [config_label(c) for c in configs]
    labels = list(base)
    for label in set(base):
        same = [i for i, b in enumerate(base) if b == label]
        if len(same) < 2:
            continue
        flat = [_flatten(comparable_config(configs[i])) for i in same]
        keys = distinguishing_keys(flat)
        for i, f in zip(same, flat):
            shown = ", ".join(f"{k}={f.get(k)}" for k in keys[:3]) + (", ..." if len(keys) > 3 else "")
            labels[i] = f"{label} ({shown})"
    return labels


def group_runs(runs: Sequence[Run], group_by: str = "config") -> List[Tuple[str, List[Run]]]:
    """``(label, runs)`` per group, groups in the order of their first run.

    Args:
        runs: The runs.
        group_by: ``config`` (same config but for ``RUN_ONLY_KEYS``; a run without ``config.yaml`` goes by its
            name), ``name`` (``strip_run_name``) or ``none`` (one group per run).
    """
    if group_by not in GROUP_BY:
        raise PlotError(f"--group-by {group_by!r}: expected one of {', '.join(GROUP_BY)}")
    keys: Dict[str, List[Run]] = {}
    for run in runs:
        seed = (run.config or {}).get("seed")
        if group_by == "none":
            key = run.path
        elif group_by == "config" and run.config is not None:
            key = "config:" + config_key(run.config)
        else:
            key = "name:" + strip_run_name(run.name, seed if isinstance(seed, int) else None)
        keys.setdefault(key, []).append(run)
    groups = list(keys.values())
    labels = [g[0].name if group_by == "none" else k.split(":", 1)[1] for k, g in keys.items()]
    by_config = [i for i, k in enumerate(keys) if k.startswith("config:")]
    for i, label in zip(by_config, _config_labels([groups[i][0].config for i in by_config])):
        labels[i] = label
    return list(zip(labels, groups))


__all__ = [
    "GROUP_BY",
    "RUN_ONLY_KEYS",
    "PlotError",
    "Run",
    "comparable_config",
    "config_key",
    "config_label",
    "distinguishing_keys",
    "find_run_dirs",
    "group_runs",
    "is_run_dir",
    "read_run",
    "read_runs",
    "strip_run_name",
]
