"""One tuning trial: K seeds of one config trained in lockstep, and the score the study maximizes.

The K ``SerialTrainer``s of a trial live in one process and take turns, one evaluation at a time: after every
round (each seed's next evaluation) the trial reports the mean over seeds of its running score to Optuna, so the
median pruner judges the seeds' average, not one seed's luck, at the same evaluation index for every trial.

Scores (``objective``), each capped at ``evaluator.stop_val`` (training stops once the target is reached, so beyond
it only reaching it sooner counts) and averaged over the seeds:

- ``auc`` (default): the area under a seed's evaluation curve over env steps ``0..max_env_step``, divided by
  ``max_env_step`` (linear between evaluations, the first evaluation held back to step 0 and the last held to the
  end; a seed that reached the target holds ``stop_val``). It rewards reaching the target in fewer env steps, which
  is what the zoo's tables measure; reported after each round over the steps seen so far.
- ``last``: a seed's last evaluation mean (rl-baselines3-zoo's objective); ``stop_val`` for a seed that reached it.
"""

from __future__ import annotations

import math
import os
from typing import Any, Iterator, List, Mapping, Sequence, Tuple

OBJECTIVES = ("auc", "last")

Curve = List[Tuple[int, float]]  # (env_step, evaluation mean return), in order


class TrialFailed(RuntimeError):
    """A trial's training went wrong in a way that is the config's fault (a non-finite evaluation, none at all)."""


def curve_score(points: Sequence[Tuple[float, float]], horizon: float, cap: float = math.inf) -> float:
    """The mean height of an evaluation curve over env steps ``[0, horizon]``.

    The curve is linear between evaluations, holds the first evaluation back to step 0 and the last one on to
    ``horizon``; values above ``cap`` count as ``cap``; points beyond ``horizon`` are cut at it.

    Args:
        points: ``(env_step, value)`` in increasing env steps; at least one.
        horizon: The env steps the mean is taken over (> 0).
        cap: The largest value that counts.

    Returns:
        The area under the curve divided by ``horizon``.

    Example:
        >>> curve_score([(500, 10.0), (1000, 200.0)], horizon=2000, cap=195)   # (5000 + 51250 + 195000) / 2000
        125.625
    """
    if not points:
        raise ValueError("curve_score needs at least one evaluation")
    if not horizon > 0:
        raise ValueError(f"curve_score needs a positive horizon, got {horizon!r}")
    capped = [(float(step), min(float(value), cap)) for step, value in points]
    pts = [(0.0, capped[0][1]), *capped]
    if pts[-1][0] < horizon:
        pts.append((float(horizon), pts[-1][1]))
    area = 0.0
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if x0 >= horizon:
            break
        if x1 > horizon:
            y1 = y0 + (y1 - y0) * (horizon - x0) / (x1 - x0)
            x1 = horizon
        area += (x1 - x0) * (y0 + y1) / 2
    return area / horizon


def seed_score(curve: Curve, objective: str, horizon: float, cap: float) -> float:
    """One seed's score under ``objective`` (``auc`` over ``[0, horizon]``, or ``last``), capped at ``cap``."""
    if objective == "auc":
        return curve_score(curve, horizon, cap)
    if objective == "last":
        return min(curve[-1][1], cap)
    raise ValueError(f"unknown objective {objective!r}; valid: {', '.join(OBJECTIVES)}")


def _quiet_console(run_dir: str) -> None:
    """Make the run's logger (``build_logger`` keeps one per run directory) print only warnings to the console:
    K seeds' evaluation lines would bury the tuner's own; ``log.txt`` keeps every line."""
    import logging

    from nervex.utils.log_helper import build_logger

    for handler in build_logger(run_dir).handlers:
        if not isinstance(handler, logging.FileHandler):
            handler.setLevel(logging.WARNING)


class SeedGroup:
    """The seeds of one trial: one ``SerialTrainer`` each, trained in lockstep in this process.

    Args:
        cfg: The trial's compiled config.
        seeds: The seeds (the same for every trial of a study: common random numbers make trials comparable).
        trial_dir: Where the seeds' run directories go (``seed_<s>/``).

    Example:
        >>> with SeedGroup(cfg, [0, 1], 'runs/tune/x/trial_0000') as group:
        ...     for n in group.rounds():
        ...         print(n, group.scores('auc'))
        ...     final = group.scores('auc', final=True)
    """

    def __init__(self, cfg: Mapping[str, Any], seeds: Sequence[int], trial_dir: str) -> None:
        from nervex.entry import SerialTrainer

        self.seeds = [int(s) for s in seeds]
        self.cap = float(cfg["evaluator"]["stop_val"])
        self.max_env_step = float(cfg["max_env_step"])
        self.curves: List[Curve] = [[] for _ in self.seeds]
        self.trainers: List[Any] = []
        self.close_errors: List[str] = []
        try:
            for seed in self.seeds:
                _quiet_console(os.path.join(trial_dir, f"seed_{seed}"))
                self.trainers.append(SerialTrainer(cfg, seed=seed, exp_name=f"seed_{seed}", run_root=trial_dir))
        except BaseException:
            self.close()
            raise

    def rounds(self) -> Iterator[int]:
        """Train every seed still running to its next evaluation; yield the round's number (1, 2, ...) each time
        at least one seed evaluated, until every seed stopped.

        Raises:
            TrialFailed: an evaluation mean is not finite.
        """
        n = 0
        while not all(t.stopped for t in self.trainers):
            grew = False
            for seed, trainer, curve in zip(self.seeds, self.trainers, self.curves):
                count = len(curve)
                while not trainer.stopped and len(curve) == count:
                    result = trainer.train()
                    if "eval/mean_reward" in result:
                        value = float(result["eval/mean_reward"])
                        if not math.isfinite(value):
                            raise TrialFailed(f"seed {seed}: evaluation mean {value} at env_step {result['env_step']}")
                        curve.append((int(result["env_step"]), value))
                grew = grew or len(curve) > count
            if grew:
                n += 1
                yield n

    def scores(self, objective: str, final: bool = False) -> List[float]:
        """Each seed's score: ``final`` over ``[0, max_env_step]``; otherwise over the env steps the latest round
        reached (a seed that stopped earlier holds its last evaluation).

        Raises:
            TrialFailed: a seed never evaluated (``evaluator.eval_freq`` above ``max_env_step``).
        """
        for seed, curve in zip(self.seeds, self.curves):
            if not curve:
                raise TrialFailed(f"seed {seed} stopped without an evaluation (evaluator.eval_freq > max_env_step?)")
        horizon = self.max_env_step if final else max(curve[-1][0] for curve in self.curves)
        return [seed_score(curve, objective, max(horizon, 1.0), self.cap) for curve in self.curves]

    @property
    def stop_reasons(self) -> List[str]:
        return [t.stop_reason or "pruned" for t in self.trainers]

    def close(self) -> None:
        """Close every trainer (final checkpoint, env processes, logs); safe to call twice. A failing close is
        noted in ``close_errors``, not raised, so it cannot hide the trial's own outcome."""
        for trainer in self.trainers:
            try:
                trainer.close()
            except Exception as e:  # a diverged run may refuse to write its final checkpoint
                self.close_errors.append(f"{type(e).__name__}: {e}")

    def __enter__(self) -> SeedGroup:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


__all__ = ["OBJECTIVES", "SeedGroup", "TrialFailed", "curve_score", "seed_score"]
