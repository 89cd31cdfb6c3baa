"""Serial evaluator: plays greedy episodes and decides when training has reached its target return."""

from __future__ import annotations

import logging
import math
import time
from typing import Any, Dict, List, Optional

import numpy as np

from nervex.config import Field, compile_section

from .env_manager import BaseEnvManager
from .serial_actor import action_clipper

# the evaluator env manager's failure counters reported by eval(), as eval/env_<name>
ENV_FAULT_COUNTERS = ("restarts", "timeouts", "crashes")


def eval_episodes_per_env(n_episode: int, env_num: int) -> int:
    """Episodes each evaluator env plays so that together they play at least ``n_episode``.

    Every env plays the same number, so short episodes cannot crowd out long ones (which would bias the mean).
    """
    return max(1, math.ceil(n_episode / max(1, env_num)))


class SerialEvaluator:
    """Runs ``n_episode`` evaluation episodes with a policy's eval mode.

    Args:
        cfg: The compiled ``evaluator`` section: ``n_episode``, ``eval_freq`` (env steps between evaluations),
            ``stop_val`` (mean return at which training stops).
        env_manager: An env manager built with ``episode_num = eval_episodes_per_env(n_episode, env_num)``.
        eval_mode: ``policy.eval_mode``.
        logger: Where a warning goes when envs were restarted during an evaluation; default: this module's logger.
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
    ) -> None:
        self._cfg = compile_section(SerialEvaluator, cfg, "evaluator")
        self._env = env_manager
        self._policy = eval_mode
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
            setting: The command mode's eval settings (keyword arguments of the eval forward).

        Returns:
            ``{'eval/mean_reward', 'eval/std_reward', 'eval/min_reward', 'eval/max_reward', 'eval/mean_ep_len',
            'eval/n_episode', 'eval/time', 'eval/env_restarts', 'eval/env_timeouts', 'eval/env_crashes',
            'stop', 'best'}``; ``stop`` is true when the mean reached ``stop_val``, ``best`` when it beat every earlier
            evaluation. The ``eval/env_*`` counters are the env manager's (``stats``), counted since it was built;
            episodes cut by a restart are left out of the returns.
        """
        start = time.perf_counter()
        restarts_before = self._env.stats["restarts"]
        self._last_eval_step = env_step
        self._env.reset()
        self._policy.reset(None)
        clip = action_clipper(self._env.env_info().act_space)
        setting = setting or {}
        returns: List[float] = []
        lengths: List[int] = []
        while not self._env.done:
            obs = self._env.ready_obs
            data_id = list(obs.keys())
            output = self._policy.forward(data_id, obs, **setting)
            timesteps = self._env.step({env_id: clip(output[env_id]["action"]) for env_id in data_id})
            for env_id, timestep in timesteps.items():
                if timestep.done:
                    self._policy.reset([env_id])
                    if "episode_return" in timestep.info and not timestep.info.get("abnormal", False):
                        returns.append(float(timestep.info["episode_return"]))
                        lengths.append(int(timestep.info["episode_len"]))
        elapsed = time.perf_counter() - start
        self.eval_time += elapsed
        mean = float(np.mean(returns)) if returns else float("nan")
        best = mean > self.best_reward
        if best:
            self.best_reward = mean
        faults = self._report_env_faults(restarts_before, env_step)
        return {
            "eval/mean_reward": mean,
            "eval/std_reward": float(np.std(returns)) if returns else float("nan"),
            "eval/min_reward": float(np.min(returns)) if returns else float("nan"),
            "eval/max_reward": float(np.max(returns)) if returns else float("nan"),
            "eval/mean_ep_len": float(np.mean(lengths)) if lengths else float("nan"),
            "eval/n_episode": len(returns),
            "eval/time": elapsed,
            **faults,
            "train_iter": train_iter,
            "env_step": env_step,
            "stop": bool(returns) and mean >= self._cfg["stop_val"],
            "best": best,
        }

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
