"""nervex DQN vs Stable-Baselines3 DQN on CartPole-v1: env steps and training seconds to reach 195 and 475.

Both are evaluated greedily on 10 episodes every 1,000 env steps; evaluation time is measured and reported apart
from training time. SB3 uses rl-baselines3-zoo's CartPole-v1 hyperparameters; nervex uses its shipped config.

    ./run.sh bench cartpole_dqn                  # 3 seeds each, both libraries
    python bench/cartpole_dqn.py --seeds 0 --only nervex --max-steps 50000
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from typing import Dict, List, Optional

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

CONFIG = os.path.join(ROOT, "app_zoo/classic_control/cartpole/config/cartpole_dqn.yaml")
THRESHOLDS = (195.0, 475.0)
EVAL_FREQ = 1000
EVAL_EPISODES = 10


def new_record() -> Dict[str, Optional[float]]:
    rec: Dict[str, Optional[float]] = {}
    for t in THRESHOLDS:
        rec[f"steps_{t:g}"] = None
        rec[f"secs_{t:g}"] = None
    return rec


def note_eval(rec: Dict[str, Optional[float]], mean: float, env_step: int, train_secs: float) -> bool:
    """Record the first crossing of each threshold; True once the highest one is reached."""
    for t in THRESHOLDS:
        if mean >= t and rec[f"steps_{t:g}"] is None:
            rec[f"steps_{t:g}"] = env_step
            rec[f"secs_{t:g}"] = train_secs
    return rec[f"steps_{THRESHOLDS[-1]:g}"] is not None


def run_nervex(seed: int, max_steps: int, run_root: str) -> Dict[str, Optional[float]]:
    from nervex.config import read_config
    from nervex.entry import SerialTrainer, compile_config

    cfg = read_config(CONFIG)
    cfg.max_env_step = max_steps
    cfg.evaluator = dict(n_episode=EVAL_EPISODES, eval_freq=EVAL_FREQ, stop_val=THRESHOLDS[-1])
    cfg.env.evaluator_env_num = 5
    cfg = compile_config(cfg)
    rec = new_record()
    start = time.perf_counter()
    with SerialTrainer(cfg, seed=seed, exp_name=f"bench_seed{seed}", run_root=run_root) as trainer:
        trainer.logger.setLevel("WARNING")
        for result in trainer:
            if "eval/mean_reward" in result:
                train_secs = time.perf_counter() - start - trainer.evaluator.eval_time
                if note_eval(rec, result["eval/mean_reward"], result["env_step"], train_secs):
                    break
        rec["eval_secs"] = trainer.evaluator.eval_time
        rec["total_steps"] = trainer.env_step
    return rec


def run_sb3(seed: int, max_steps: int) -> Dict[str, Optional[float]]:
    import gymnasium as gym
    import torch
    from stable_baselines3 import DQN
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.evaluation import evaluate_policy

    torch.set_num_threads(1)
    rec = new_record()
    eval_env = gym.make("CartPole-v1")

    class EvalTimer(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.eval_secs = 0.0
            self.start = time.perf_counter()

        def _on_step(self) -> bool:
            if self.num_timesteps % EVAL_FREQ != 0:
                return True
            t0 = time.perf_counter()
            mean, _ = evaluate_policy(self.model, eval_env, n_eval_episodes=EVAL_EPISODES, deterministic=True)
            self.eval_secs += time.perf_counter() - t0
            train_secs = time.perf_counter() - self.start - self.eval_secs
            return not note_eval(rec, float(mean), self.num_timesteps, train_secs)

    env = gym.make("CartPole-v1")
    # rl-baselines3-zoo hyperparams/dqn.yml, CartPole-v1 (n_timesteps 5e4: exploration over 0.16 * 5e4 = 8k steps)
    model = DQN(
        "MlpPolicy",
        env,
        learning_rate=2.3e-3,
        batch_size=64,
        buffer_size=100_000,
        learning_starts=1000,
        gamma=0.99,
        target_update_interval=10,
        train_freq=256,
        gradient_steps=128,
        exploration_fraction=8000 / max_steps,
        exploration_final_eps=0.04,
        policy_kwargs=dict(net_arch=[256, 256]),
        seed=seed,
        verbose=0,
        device="cpu",
    )
    cb = EvalTimer()
    model.learn(total_timesteps=max_steps, callback=cb)
    rec["eval_secs"] = cb.eval_secs
    rec["total_steps"] = model.num_timesteps
    return rec


def median(values: List[Optional[float]]) -> Optional[float]:
    """Median over seeds; a seed that never reached the threshold counts as infinitely slow."""
    vals = [v if v is not None else float("inf") for v in values]
    m = statistics.median(vals)
    return None if m == float("inf") else m


def fmt(v: Optional[float], unit: str) -> str:
    if v is None:
        return "not reached"
    return f"{v:,.0f}" if unit == "steps" else f"{v:.1f}s"


def report(results: Dict[str, List[Dict[str, Optional[float]]]]) -> None:
    print("\nper seed:")
    for lib, recs in results.items():
        for i, r in enumerate(recs):
            parts = [
                f"{k}={fmt(v, 'steps' if k.startswith('steps') or k == 'total_steps' else 's')}" for k, v in r.items()
            ]
            print(f"  {lib:8s} seed {i}: " + " ".join(parts))
    print("\nmedians of seeds (training time excludes evaluation):")
    header = f"{'':10s}" + "".join(f"{f'steps to {t:g}':>16s}{f'secs to {t:g}':>14s}" for t in THRESHOLDS)
    print(header)
    med = {lib: {k: median([r[k] for r in recs]) for k in recs[0]} for lib, recs in results.items()}
    for lib in results:
        row = f"{lib:10s}"
        for t in THRESHOLDS:
            row += f"{fmt(med[lib][f'steps_{t:g}'], 'steps'):>16s}{fmt(med[lib][f'secs_{t:g}'], 's'):>14s}"
        print(row)
    if "nervex" in med and "sb3" in med:
        print("\nratio sb3 / nervex (>1 means nervex is better):")
        for t in THRESHOLDS:
            for kind in ("steps", "secs"):
                a, b = med["sb3"][f"{kind}_{t:g}"], med["nervex"][f"{kind}_{t:g}"]
                ratio = "n/a" if a is None or b is None or b == 0 else f"{a / b:.2f}x"
                print(f"  {kind} to {t:g}: {ratio}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--max-steps", type=int, default=100_000)
    parser.add_argument("--only", choices=["nervex", "sb3"], default=None)
    args = parser.parse_args()
    results: Dict[str, List[Dict[str, Optional[float]]]] = {}
    with tempfile.TemporaryDirectory() as run_root:
        for lib in ("nervex", "sb3"):
            if args.only and lib != args.only:
                continue
            if lib == "sb3":
                try:
                    import stable_baselines3  # noqa: F401
                except ImportError:
                    print("stable-baselines3 is not installed (pip install -e .[bench]); skipping the peer")
                    continue
            for seed in args.seeds:
                t0 = time.perf_counter()
                rec = run_nervex(seed, args.max_steps, run_root) if lib == "nervex" else run_sb3(seed, args.max_steps)
                print(f"{lib} seed {seed}: {rec} ({time.perf_counter() - t0:.1f}s wall)", flush=True)
                results.setdefault(lib, []).append(rec)
    np.set_printoptions(precision=2)
    report(results)


if __name__ == "__main__":
    main()
