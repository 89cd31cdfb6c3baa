"""Per-episode figures beyond the slot's return: a cooperative env's team return (summed and averaged over agents)
and per-agent returns, and the figures an env measures itself (``info['episode_stats']``); their means over a window.

The actor logs them as ``rollout/<name>`` (means over its ``ep_info_window``), the evaluator as ``eval/<name>``
(means over an evaluation's episodes) and as columns of ``eval.csv``:

- ``team_return_sum``: the sum of the agents' returns (whatever the env's ``team_reward``), ``team_return_mean``:
  their mean; ``return/<agent_id>``: each agent's (simultaneous-move envs of several agents only);
- ``<name>``: each entry of the env's ``info['episode_stats']`` (``coverage``, ``win``, ``normalized_return``...),
  averaged over the episodes that report it.
"""

from __future__ import annotations

import math
import re
from typing import Any, Dict, Iterable, Mapping

TEAM_FIGURES = ("team_return_sum", "team_return_mean")
RESERVED_NAMES = frozenset(
    {
        *TEAM_FIGURES,
        "return",
        # rollout/* figures of the actor
        "episodes",
        "ep_rew_mean",
        "ep_len_mean",
        "win_rate",
        "wins",
        "draws",
        "losses",
        "abnormal_episodes",
        # eval/* figures and eval.csv columns
        "mean_reward",
        "std_reward",
        "min_reward",
        "max_reward",
        "mean_ep_len",
        "n_episode",
        "time",
        "env_step",
        "train_iter",
        "wall_time",
        "eval_time",
        "stop",
        "best",
    }
)
"""Names an env's episode stat may not take: they are the actor's and the evaluator's own figures."""
STAT_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def episode_stats(info: Mapping[str, Any], env_id: int) -> Dict[str, float]:
    """The env's ``info['episode_stats']`` as finite floats, sorted by name (empty when the env reports none).

    Raises:
        ValueError: not a dict, a name that is not an identifier or is one of ``RESERVED_NAMES`` (or starts with
            ``env_``), a value that is not a finite number; the message names the env and the stat.
    """
    stats = info.get("episode_stats")
    if stats is None:
        return {}
    if not isinstance(stats, Mapping):
        raise ValueError(f"env {env_id}: info['episode_stats'] must be a dict of floats, got {type(stats).__name__}")
    out: Dict[str, float] = {}
    for name in sorted(stats, key=str):
        if not isinstance(name, str) or not STAT_NAME.match(name) or name in RESERVED_NAMES or name.startswith("env_"):
            raise ValueError(
                f"env {env_id}: info['episode_stats'] names a stat {name!r}; a stat is an identifier other than "
                f"env_* and {sorted(RESERVED_NAMES)} (they are nervex's own figures)"
            )
        try:
            value = float(stats[name])
        except (TypeError, ValueError):
            raise ValueError(
                f"env {env_id}: info['episode_stats'][{name!r}] must be a number, got {stats[name]!r}"
            ) from None
        if not math.isfinite(value):
            raise ValueError(f"env {env_id}: info['episode_stats'][{name!r}] must be finite, got {value}")
        out[name] = value
    return out


def episode_figures(agent_returns: Mapping[str, float], stats: Mapping[str, float]) -> Dict[str, float]:
    """One episode's figures: ``team_return_sum``, ``team_return_mean`` and ``return/<agent_id>`` when
    ``agent_returns`` (per agent id) is given, then the env's ``stats``.

    Example:
        >>> episode_figures({'a': 1.0, 'b': 3.0}, {'coverage': 0.5})
        {'team_return_sum': 4.0, 'team_return_mean': 2.0, 'return/a': 1.0, 'return/b': 3.0, 'coverage': 0.5}
    """
    figures: Dict[str, float] = {}
    if agent_returns:
        total = float(sum(agent_returns.values()))
        figures["team_return_sum"] = total
        figures["team_return_mean"] = total / len(agent_returns)
        figures.update({f"return/{agent}": float(value) for agent, value in agent_returns.items()})
    figures.update(stats)
    return figures


def window_means(episodes: Iterable[Mapping[str, float]]) -> Dict[str, float]:
    """Each figure's mean over the episodes that have it, in the order figures first appear.

    Example:
        >>> window_means([{'win': 1.0}, {'win': 0.0, 'coverage': 0.5}])
        {'win': 0.5, 'coverage': 0.5}
    """
    sums: Dict[str, float] = {}
    counts: Dict[str, int] = {}
    for figures in episodes:
        for name, value in figures.items():
            sums[name] = sums.get(name, 0.0) + value
            counts[name] = counts.get(name, 0) + 1
    return {name: sums[name] / counts[name] for name in sums}


__all__ = ["TEAM_FIGURES", "RESERVED_NAMES", "episode_stats", "episode_figures", "window_means"]
