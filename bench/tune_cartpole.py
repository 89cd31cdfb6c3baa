"""``nervex -m tune`` on CartPole DQN, then the best config against the shipped one on held-out seeds.

1. Tune (the shipped config's values are trial 0): ``nervex -m tune`` over ``cartpole_dqn_space.yaml`` (TPE + median pruning, ``--seeds`` seeds per trial,
   objective ``auc``: the mean evaluation return over 0..max_env_step capped at 195), resumable from its SQLite
   storage (run the same command again after a kill).
2. Held out: the tuned ``best_config.yaml`` and the shipped ``cartpole_dqn.yaml`` each train on seeds not used in
   tuning (default 10-14), evaluated greedily on 10 episodes every ``--eval-freq`` env steps (the same protocol for
   both); the env steps and training seconds (evaluation time excluded) to the first mean >= 195 and >= 475.

    nice -n 5 python bench/tune_cartpole.py --trials 12 --seeds 3 --held-out 10 11 12 13 14
    python bench/tune_cartpole.py --skip-tune --best runs/tune/.../best_config.yaml   # phase 2 only

Writes ``bench/results/tune/tune_cartpole_<date>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from typing import Any, Dict, List, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

CONFIG = os.path.join(ROOT, "app_zoo/classic_control/cartpole/config/cartpole_dqn.yaml")
SPACE = os.path.join(ROOT, "app_zoo/classic_control/cartpole/config/cartpole_dqn_space.yaml")
THRESHOLDS = (195.0, 475.0)


def tune(args: argparse.Namespace) -> Dict[str, Any]:
    """Phase 1 through the command line; returns the command, its wall time and the trials table."""
    from nervex.entry.cli import main

    argv = ["-m", "tune", "-c", CONFIG, "--space", SPACE, "--trials", str(args.trials), "--seeds", str(args.seeds)]
    argv += ["--storage", f"sqlite:///{os.path.abspath(args.storage)}", "--study-name", args.study]
    argv += ["--run-root", args.run_root, "--set", f"max_env_step={args.tune_steps}"]
    argv += ["--set", f"evaluator.eval_freq={args.tune_eval_freq}"]
    enqueue_shipped(args)
    start = time.time()
    code = main(argv)
    if code != 0:
        raise SystemExit(f"nervex -m tune exited with {code}")
    tune_dir = os.path.join(args.run_root, "tune", args.study)
    import csv

    with open(os.path.join(tune_dir, "trials.csv"), newline="") as f:
        trials = list(csv.DictReader(f))
    return {
        "command": "nervex " + " ".join(argv),
        "wall_s_this_invocation": round(time.time() - start, 1),
        "trials": trials,
        "best_config": os.path.join(tune_dir, "best_config.yaml"),
    }


def enqueue_shipped(args: argparse.Namespace) -> None:
    """Make the shipped config's values the study's first trial (once): the tuner must beat it on the same seeds."""
    import optuna
    import yaml

    from nervex.config import read_config
    from nervex.tools.search_space import choice_label, lookup

    storage = f"sqlite:///{os.path.abspath(args.storage)}"
    study = optuna.create_study(study_name=args.study, storage=storage, direction="maximize", load_if_exists=True)
    if study.trials:
        return
    with open(SPACE, encoding="utf-8") as f:
        keys = list(yaml.safe_load(f))
    shipped = read_config(CONFIG)
    study.enqueue_trial({key: choice_label(lookup(shipped, key)) for key in keys}, user_attrs={"shipped": True})


def held_out_run(config: str, seed: int, args: argparse.Namespace) -> Dict[str, Optional[float]]:
    """Train one seed to 475 (or ``--max-steps``); the first crossing of each threshold, steps and seconds."""
    from nervex.config import read_config
    from nervex.entry import SerialTrainer, compile_config

    cfg = read_config(config)
    cfg.max_env_step = args.max_steps
    cfg.evaluator = dict(n_episode=10, eval_freq=args.eval_freq, stop_val=THRESHOLDS[-1])
    cfg = compile_config(cfg)
    rec: Dict[str, Optional[float]] = {f"steps_{t:g}": None for t in THRESHOLDS}
    rec.update({f"secs_{t:g}": None for t in THRESHOLDS})
    start = time.perf_counter()
    name = os.path.splitext(os.path.basename(config))[0]
    with SerialTrainer(cfg, seed=seed, exp_name=f"{name}_seed{seed}", run_root=args.held_out_root) as trainer:
        trainer.logger.setLevel("WARNING")
        for result in trainer:
            if "eval/mean_reward" in result:
                train_secs = time.perf_counter() - start - trainer.evaluator.eval_time
                for t in THRESHOLDS:
                    if result["eval/mean_reward"] >= t and rec[f"steps_{t:g}"] is None:
                        rec[f"steps_{t:g}"] = result["env_step"]
                        rec[f"secs_{t:g}"] = round(train_secs, 2)
        rec["total_steps"] = trainer.env_step
    return rec


def median(values: List[Optional[float]]) -> Optional[float]:
    """Median over seeds; a seed that never reached the threshold counts as infinitely slow."""
    m = statistics.median([v if v is not None else float("inf") for v in values])
    return None if m == float("inf") else m


def compare(best: str, args: argparse.Namespace) -> Dict[str, Any]:
    """Phase 2: every held-out seed of both configs, interleaved so both see the same machine load."""
    runs: Dict[str, List[Dict[str, Any]]] = {"shipped": [], "tuned": []}
    for seed in args.held_out:
        for label, config in (("shipped", CONFIG), ("tuned", best)):
            rec = held_out_run(config, seed, args)
            rec["seed"] = seed
            runs[label].append(rec)
            print(f"{label:8s} seed {seed}: {rec}", flush=True)
    medians = {
        label: {key: median([r[key] for r in recs]) for key in recs[0] if key.startswith(("steps_", "secs_"))}
        for label, recs in runs.items()
    }
    return {"runs": runs, "medians": medians}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=12)
    parser.add_argument("--seeds", type=int, default=3, help="seeds per trial (0..seeds-1)")
    parser.add_argument("--tune-steps", type=int, default=10_000, help="max_env_step of each tuning run")
    parser.add_argument("--tune-eval-freq", type=int, default=500)
    parser.add_argument("--study", default="cartpole_dqn_bench")
    parser.add_argument("--storage", default="/tmp/nervex_tune_bench/tune.db")
    parser.add_argument("--run-root", default="/tmp/nervex_tune_bench/runs")
    parser.add_argument("--held-out", type=int, nargs="+", default=[10, 11, 12, 13, 14])
    parser.add_argument("--held-out-root", default="/tmp/nervex_tune_bench/held_out")
    parser.add_argument("--eval-freq", type=int, default=250, help="held-out evaluation interval (both configs)")
    parser.add_argument("--max-steps", type=int, default=50_000, help="held-out budget per seed")
    parser.add_argument("--skip-tune", action="store_true", help="phase 2 only, with --best")
    parser.add_argument("--best", default=None, help="a best_config.yaml (default: the one phase 1 writes)")
    parser.add_argument("--out", default=os.path.join(ROOT, "bench/results/tune"))
    args = parser.parse_args()
    os.makedirs(os.path.dirname(os.path.abspath(args.storage)), exist_ok=True)
    result: Dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.node()}: {os.cpu_count()} cores, {platform.processor() or platform.machine()}, no GPU",
        "command": "python bench/tune_cartpole.py " + " ".join(sys.argv[1:]),
    }
    if not args.skip_tune:
        start = time.time()
        result["tune"] = tune(args)
        result["tune"]["wall_s"] = round(time.time() - start, 1)
    best = args.best or result.get("tune", {}).get("best_config")
    if best is None:
        raise SystemExit("phase 2 needs --best BEST_CONFIG.yaml with --skip-tune")
    with open(best, encoding="utf-8") as f:
        result["best_config_header"] = [line.rstrip() for line in f if line.startswith("#")]
    start = time.time()
    result["held_out"] = compare(best, args)
    result["held_out"]["wall_s"] = round(time.time() - start, 1)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"tune_cartpole_{result['date']}.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result["held_out"]["medians"], indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
