"""Serial evaluator: plays greedy episodes (the learning slots against the act-only ones) and decides when training
has reached its target return."""

from __future__ import annotations

import logging
import math
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

import numpy as np

from nervex.config import Field, compile_section

from .env_manager import BaseEnvManager
from .figures import TEAM_FIGURES, episode_figures, window_means
from .seating import Seating, build_seating
from .serial_actor import action_clipper
from .slots import PolicySlot

# the evaluator env manager's failure counters reported by eval(), as eval/env_<name>
ENV_FAULT_COUNTERS = ("restarts", "timeouts", "crashes")


def eval_episodes_per_env(n_episode: int, env_num: int) -> int:
    """Episodes each evaluator env plays so that together they play at least ``n_episode``.

    Every env plays the same number, so short episodes cannot crowd out long ones (which would bias the mean).
    """
    return max(1, math.ceil(n_episode / max(1, env_num)))


def outcome_figures(outcomes: List[int]) -> Dict[str, Any]:
    """``eval/wins``, ``eval/draws``, ``eval/losses`` and ``eval/win_rate`` of a game's outcomes (+1, 0, -1); empty
    when there are none (not a game)."""
    if not outcomes:
        return {}
    counts = {
        name: sum(1 for o in outcomes if o == value) for name, value in (("wins", 1), ("draws", 0), ("losses", -1))
    }
    return {f"eval/{name}": count for name, count in counts.items()} | {"eval/win_rate": counts["wins"] / len(outcomes)}


class SerialEvaluator:
    """Runs ``n_episode`` evaluation episodes: the policy's eval mode plays the learning slots' seats, the act-only
    slots of ``actor.slots`` (random, snapshot, callable) play theirs, as in collection.

    Args:
        cfg: The compiled ``evaluator`` section: ``n_episode``, ``eval_freq`` (env steps between evaluations),
            ``stop_val`` (mean return at which training stops).
        env_manager: An env manager built with ``episode_num = eval_episodes_per_env(n_episode, env_num)``.
        eval_mode: ``policy.eval_mode``.
        logger: Where a warning goes when envs were restarted during an evaluation; default: this module's logger.
        slots: The ``actor.slots`` section (None: the eval mode plays every seat).
        seed: Seeds the act-only slots' random actions.
        policy_factory: Makes a fresh eval-mode policy for a ``snapshot`` slot.
    """

    config: Dict[str, Any] = dict(
        n_episode=Field(10, ge=1),
        eval_freq=Field(1000, ge=1),  # env steps between evaluations
        stop_val=195.0,  # stop training once the mean evaluation return reaches this
        eval_at_start=False,  # also evaluate the untrained policy at env step 0
    )

    def __init__(
        self,
        cfg: Optional[Dict[str, Any]],
        env_manager: BaseEnvManager,
        eval_mode: Any,
        logger: Optional[logging.Logger] = None,
        slots: Optional[Mapping[str, Any]] = None,
        seed: int = 0,
        policy_factory: Optional[Callable[[], Any]] = None,
    ) -> None:
        self._cfg = compile_section(SerialEvaluator, cfg, "evaluator")
        self._env = env_manager
        self.seating: Seating = build_seating(
            slots,
            env_manager.env_info(),
            lambda name, rng, agent_spaces: PolicySlot(name, "learn", eval_mode),
            seed,
            policy_factory,
        )
        seating = self.seating
        # eval.csv's columns beyond the base ones: the team and per-agent returns (many agents), then the env's
        # episode stats as evaluations first report them
        self.figure_names: List[str] = (
            [*TEAM_FIGURES, *(f"return/{agent}" for agent in seating.seat_ids)] if seating.cooperative else []
        )
        self.logger = logger or logging.getLogger(__name__)
        self._last_eval_step: float = -math.inf if cfg.get("eval_at_start", False) else 0
        self.eval_time = 0.0
        self.best_reward = -math.inf

    def should_eval(self, env_step: int) -> bool:
        return env_step - self._last_eval_step >= self._cfg["eval_freq"]

    def eval(self, train_iter: int = 0, env_step: int = 0, setting: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
        """Play the evaluation episodes.

        Args:
            train_iter, env_step: Progress, reported with the figures.
            setting: The command mode's eval settings (keyword arguments of the learning slots' eval forward).

        Returns:
            ``{'eval/mean_reward', 'eval/std_reward', 'eval/min_reward', 'eval/max_reward', 'eval/mean_ep_len',
            'eval/n_episode', 'eval/time', 'eval/env_restarts', 'eval/env_timeouts', 'eval/env_crashes',
            'stop', 'best'}``, the rewards being the first learning slot's returns; for games also ``eval/wins``,
            ``eval/draws``, ``eval/losses`` (its outcomes, counted exactly: they sum to ``eval/n_episode``) and
            ``eval/win_rate``; for many agents ``eval/team_return_sum``, ``eval/team_return_mean``,
            ``eval/return/<agent_id>`` (means over the episodes; NaN when none finished) and every
            ``info['episode_stats']`` entry as ``eval/<name>`` (its mean over the episodes that report it; the names
            so far are ``figure_names``). ``stop`` is true when the mean reached ``stop_val``, ``best`` when it beat every
            earlier evaluation. The ``eval/env_*`` counters are the env manager's (``stats``), counted since it was
            built; episodes cut by a restart are left out.
        """
        start = time.perf_counter()
        restarts_before = self._env.stats["restarts"]
        self._last_eval_step = env_step
        returns, lengths, outcomes, figures = self._play(setting or {})
        elapsed = time.perf_counter() - start
        self.eval_time += elapsed
        mean = float(np.mean(returns)) if returns else float("nan")
        best = mean > self.best_reward
        if best:
            self.best_reward = mean
        faults = self._report_env_faults(restarts_before, env_step)
        episode = {name: float("nan") for name in self.figure_names} | window_means(figures)
        self.figure_names += [name for name in episode if name not in self.figure_names]
        return {
            "eval/mean_reward": mean,
            "eval/std_reward": float(np.std(returns)) if returns else float("nan"),
            "eval/min_reward": float(np.min(returns)) if returns else float("nan"),
            "eval/max_reward": float(np.max(returns)) if returns else float("nan"),
            "eval/mean_ep_len": float(np.mean(lengths)) if lengths else float("nan"),
            "eval/n_episode": len(returns),
            **outcome_figures(outcomes),
            **{f"eval/{name}": value for name, value in episode.items()},
            "eval/time": elapsed,
            **faults,
            "train_iter": train_iter,
            "env_step": env_step,
            "stop": bool(returns) and mean >= self._cfg["stop_val"],
            "best": best,
        }

    def _play(self, setting: Dict[str, Any]) -> Tuple[List[float], List[int], List[int], List[Dict[str, float]]]:
        """Every env's episodes: the first learning slot's returns, the lengths, (games) its outcomes and each
        episode's team/agent returns and env stats."""
        self._env.reset()
        seating = self.seating
        seating.reset(None)
        clip = action_clipper(self._env.env_info().act_space)
        returns: List[float] = []
        lengths: List[int] = []
        outcomes: List[int] = []
        figures: List[Dict[str, float]] = []
        while not self._env.done:
            obs = self._env.ready_obs
            acted = seating.act(obs, setting)
            timesteps = self._env.step({env_id: clip(acted[env_id][1]["action"]) for env_id in obs})
            for env_id, timestep in timesteps.items():
                if not timestep.done:
                    continue
                seating.reset([env_id])
                if "episode_return" in timestep.info and not timestep.info.get("abnormal", False):
                    result = seating.result(env_id, timestep.info)
                    returns.append(result.returns[seating.main])
                    lengths.append(result.length)
                    figures.append(episode_figures(result.agent_returns, result.stats))
                    if seating.main in result.outcomes:
                        outcomes.append(result.outcomes[seating.main])
        return returns, lengths, outcomes, figures

    def _report_env_faults(self, restarts_before: int, env_step: int) -> Dict[str, int]:
        """The env manager's fault counters as ``eval/env_<name>``; a warning when envs were restarted meanwhile."""
        stats = self._env.stats
        faults = {f"eval/env_{name}": int(stats[name]) for name in ENV_FAULT_COUNTERS}
        new_restarts = stats["restarts"] - restarts_before
        if new_restarts > 0:
            self.logger.warning(
                f"[evaluator] {new_restarts} env restart(s) during the evaluation at env_step={env_step}; since the "
                f"start: restarts: {stats['restarts']}, timeouts: {stats['timeouts']}, crashes: {stats['crashes']}, "
                f"dropped episodes: {stats['dropped_episodes']}"
            )
        return faults

    def close(self) -> None:
        self._env.close()
