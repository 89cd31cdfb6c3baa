"""BenchMARL's side of the VMAS benchmark: its QMIX or MAPPO on VMAS ``simple_spread``, for a wall-clock budget.

``run_benchmarl(algorithm, seed, budget_s)`` starts one BenchMARL experiment in a child process (one thread:
``OMP_NUM_THREADS=1`` and ``torch.set_num_threads(1)``; the child also gets a hard kill at ``budget_s`` plus a
grace) and returns what it measured:

- ``curve``: ``[(wall_s, frames, eval_return)]``, one point per BenchMARL evaluation (its default schedule: after
  the first iteration, then every ``evaluation_interval`` = 120,000 frames) plus one final evaluation when the budget
  runs out (its time is not charged to the budget). ``wall_s`` counts from the start of ``Experiment.run`` (the
  experiment's setup is excluded), ``eval_return`` is BenchMARL's ``eval/reward/episode_reward_mean``: the per-agent
  return averaged over agents (in simple_spread every agent gets the team's reward, so it is the scenario's return,
  nervex's ``team_reward: mean``), averaged over ``evaluation_episodes`` = 10 episodes of 100 steps.
- ``collect_fps``: frames collected per second of collection; ``optim_steps_per_s`` and ``train_samples_per_s``:
  optimizer steps (minibatches) and the samples in them per second of training (buffer writes included, as in
  BenchMARL's ``timers/training_time``). The callback times the phases itself (between its calls), so a budget that
  ends inside an iteration still counts; ``collect_s``, ``train_s``, ``eval_s`` and the counts come with them.
- ``frames`` (collected), ``iterations`` (finished), ``setup_s``, ``stopped_by`` (``'budget'`` or ``'done'``),
  ``log_dir`` (BenchMARL's experiment folder: its csv scalars and marl-eval json).

The experiment is BenchMARL's default: ``conf/experiment/base_experiment.yaml``, ``conf/algorithm/<alg>.yaml``,
``conf/task/vmas/simple_spread.yaml`` (3 agents, 100 steps, ``obs_agents``) and ``conf/model/layers/mlp.yaml``
(256x256 Tanh), read with BenchMARL's own ``get_from_yaml``. Changed, none of which touches learning: ``loggers:
[csv]`` (no W&B), ``render: False`` (no evaluation videos), ``save_folder`` = the run's folder, ``max_n_frames``
left at its 3M (the budget stops the run first). QMIX acts on VMAS's discrete actions (9 per agent), MAPPO on the
continuous ones (``prefer_continuous_actions: True`` in BenchMARL's default). The budget is enforced by a BenchMARL
``Callback`` that checks the clock after each collected batch and each optimizer step and stops the experiment by
raising, after one last evaluation (BenchMARL then prints "Experiment failed and is closing gracefully": it closes
its collector and logger, and the child returns the figures).

    python bench/marl_benchmarl.py --algorithm qmix --seed 0 --budget 60 --out runs/benchmarl_smoke
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ALGORITHMS = ("qmix", "mappo")
KILL_GRACE_S = 600.0  # setup + the iteration in progress + the last evaluation, beyond the budget


def run_benchmarl(
    algorithm: str, seed: int, budget_s: float, out_dir: str, python: Optional[str] = None, timeout_s: float = 0.0
) -> Dict[str, Any]:
    """Run BenchMARL's ``algorithm`` on VMAS simple_spread for ``budget_s`` seconds in a one-thread child process.

    Args:
        algorithm: ``'qmix'`` or ``'mappo'``.
        seed: BenchMARL's experiment seed.
        budget_s: Wall-clock seconds of ``Experiment.run`` (setup excluded) before the run is stopped.
        out_dir: Where the child writes BenchMARL's logs and ``result.json`` (created).
        python: The interpreter (default: this one).
        timeout_s: Hard limit for the child (default ``budget_s + KILL_GRACE_S``).

    Returns:
        The dict described in the module docstring, plus ``log_dir`` (BenchMARL's experiment folder).

    Raises:
        ValueError: an unknown algorithm or a budget <= 0.
        RuntimeError: the child failed or was killed; the message holds the tail of its output.
    """
    if algorithm not in ALGORITHMS:
        raise ValueError(f"run_benchmarl: unknown algorithm {algorithm!r}; BenchMARL's side runs {ALGORITHMS}")
    if not budget_s > 0:
        raise ValueError(f"run_benchmarl: budget_s must be > 0 seconds, got {budget_s!r}")
    os.makedirs(out_dir, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", WANDB_MODE="disabled")
    cmd = [python or sys.executable, os.path.abspath(__file__), "--child", "--algorithm", algorithm]
    cmd += ["--seed", str(seed), "--budget", str(budget_s), "--out", out_dir]
    limit = timeout_s or budget_s + KILL_GRACE_S
    try:
        proc = subprocess.run(cmd, env=env, cwd=out_dir, capture_output=True, text=True, timeout=limit)
    except subprocess.TimeoutExpired as e:
        raise RuntimeError(f"BenchMARL {algorithm} seed {seed}: killed after {limit:.0f} s") from e
    result_path = os.path.join(out_dir, "result.json")
    if proc.returncode != 0 or not os.path.exists(result_path):
        tail = (proc.stdout + proc.stderr)[-3000:]
        raise RuntimeError(f"BenchMARL {algorithm} seed {seed} failed (exit {proc.returncode}):\n{tail}")
    with open(result_path) as f:
        return json.load(f)


# ---- the child: one experiment ------------------------------------------------------------------------------------
def _experiment(algorithm: str, seed: int, out_dir: str, callbacks: List[Any]) -> Any:
    """BenchMARL's default experiment for ``algorithm`` on VMAS simple_spread (logging changes only)."""
    from benchmarl.algorithms import MappoConfig, QmixConfig
    from benchmarl.environments import VmasTask
    from benchmarl.experiment import Experiment, ExperimentConfig
    from benchmarl.models.mlp import MlpConfig

    config = ExperimentConfig.get_from_yaml()
    config.loggers = ["csv"]
    config.render = False
    config.save_folder = out_dir
    config.checkpoint_at_end = False
    algorithm_config = (QmixConfig if algorithm == "qmix" else MappoConfig).get_from_yaml()
    return Experiment(
        task=VmasTask.SIMPLE_SPREAD.get_from_yaml(),
        algorithm_config=algorithm_config,
        model_config=MlpConfig.get_from_yaml(),
        critic_model_config=MlpConfig.get_from_yaml(),
        seed=seed,
        config=config,
        callbacks=callbacks,
    )


class _BudgetExhausted(Exception):
    """Raised from the budget callback to stop ``Experiment.run``."""


try:  # BenchMARL pickles an experiment's callbacks: the class must live at module level
    from benchmarl.experiment.callback import Callback as _Callback
except ImportError:  # the parent process needs only run_benchmarl
    _Callback = object


class BudgetCallback(_Callback):
    """Times collection and training, records every evaluation, and stops the run (after a last evaluation) once
    ``budget_s`` seconds have passed since ``start``.

    The phases are timed between callbacks: collection from the end of the previous phase to ``on_batch_collected``,
    training from there through each ``on_train_step`` (buffer writes included, as in BenchMARL's
    ``timers/training_time``); evaluations are timed apart and excluded from both.
    """

    def __init__(self, budget_s: float) -> None:
        super().__init__()
        self.budget_s = budget_s
        self.start = self.mark = time.perf_counter()  # set again by the child right before run()
        self.curve: List[Tuple[float, int, float]] = []
        self.stopping = False
        self.timers = dict(collect_s=0.0, train_s=0.0, eval_s=0.0)
        self.counts = dict(frames_collected=0, optim_steps=0, samples_trained=0, evaluations=0)

    def begin(self) -> None:
        self.start = self.mark = time.perf_counter()

    def _lap(self, timer: str) -> float:
        now = time.perf_counter()
        self.timers[timer] += now - self.mark
        self.mark = now
        return now

    def on_batch_collected(self, batch: Any) -> None:
        self._lap("collect_s")
        self.counts["frames_collected"] += batch.numel()
        self._check()

    def on_train_step(self, batch: Any, group: str) -> None:
        self._lap("train_s")
        self.counts["optim_steps"] += 1
        self.counts["samples_trained"] += batch.numel()
        self._check()

    def on_evaluation_end(self, rollouts: List[Any]) -> None:
        now = self._lap("eval_s")
        self.counts["evaluations"] += 1
        # BenchMARL's eval/reward/episode_reward_mean: per episode, the reward summed over time and averaged over
        # agents; averaged over episodes, then over groups
        logger = self.experiment.logger
        group_returns = [
            sum(float(logger._get_reward(group, td).sum(0).mean()) for td in rollouts) / len(rollouts)
            for group in self.experiment.group_map
        ]
        wall = min(now - self.start, self.budget_s) if self.stopping else now - self.start
        self.curve.append((wall, self.experiment.total_frames, sum(group_returns) / len(group_returns)))

    def _check(self) -> None:
        if not self.stopping and time.perf_counter() - self.start >= self.budget_s:
            self.stopping = True
            self.experiment._evaluation_loop()  # the last point of the curve, at the budget
            self.experiment.logger.commit()
            raise _BudgetExhausted()

    def figures(self) -> Dict[str, Any]:
        t, c = self.timers, self.counts
        return dict(
            **t,
            **c,
            collect_fps=c["frames_collected"] / t["collect_s"] if t["collect_s"] else float("nan"),
            optim_steps_per_s=c["optim_steps"] / t["train_s"] if t["train_s"] else float("nan"),
            train_samples_per_s=c["samples_trained"] / t["train_s"] if t["train_s"] else float("nan"),
        )


def _child(algorithm: str, seed: int, budget_s: float, out_dir: str) -> None:
    import torch

    torch.set_num_threads(1)
    started = time.perf_counter()
    callback = BudgetCallback(budget_s)
    experiment = _experiment(algorithm, seed, out_dir, [callback])
    setup_s = time.perf_counter() - started
    callback.begin()
    stopped_by = "done"
    try:
        experiment.run()
    except _BudgetExhausted:
        stopped_by = "budget"
    result = dict(
        algorithm=algorithm,
        seed=seed,
        budget_s=budget_s,
        setup_s=setup_s,
        stopped_by=stopped_by,
        curve=callback.curve,
        frames=experiment.total_frames,
        iterations=experiment.n_iters_performed,
        torch_threads=torch.get_num_threads(),
        log_dir=str(experiment.folder_name),
        **callback.figures(),
    )
    with open(os.path.join(out_dir, "result.json"), "w") as f:
        json.dump(result, f, indent=1)


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--algorithm", choices=ALGORITHMS, default="qmix")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--budget", type=float, default=60.0, help="wall-clock seconds of training")
    parser.add_argument("--out", default=os.path.join(ROOT, "runs", "benchmarl"))
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    out = os.path.abspath(args.out)
    if args.child:
        _child(args.algorithm, args.seed, args.budget, out)
        return
    result = run_benchmarl(args.algorithm, args.seed, args.budget, os.path.join(out, f"{args.algorithm}_{args.seed}"))
    print(json.dumps({k: v for k, v in result.items()}, indent=1))


if __name__ == "__main__":
    main()
