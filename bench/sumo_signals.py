"""SUMO single intersection (sumo-rl on libsumo): DQN / PPO against the fixed-time plan and SUMO's actuated control.

Every controller is measured the same way: one 3600-second episode per held-out env seed (the SUMO seed of the
episode is the first draw of ``numpy.random.default_rng(seed)``; the routes' departures are random), through the same
``SumoEnv``, with the same figures. The metric is ``vehicle_waiting_time``: the mean, over the vehicles that entered
the network, of their accumulated waiting time (seconds spent below 0.1 m/s; SUMO's tripinfo ``waitingTime``
definition). sumo-rl's ``system_mean_waiting_time`` (averaged over decision steps: ``mean_waiting_time``) is recorded
too, but it only counts each vehicle's *current* stop, so a controller that makes queues creep forward lowers it
while vehicles wait longer in total; it is not the comparison.

Parts (each saves JSON records under ``bench/results/sumo/``; ``--report`` prints the markdown table):

- ``speed``: env steps per second of sumo-rl's ``SumoEnvironment`` on libsumo and on TraCI (one episode each,
  fixed-time, the same code in a fresh process per backend).
- ``baselines``: fixed-time and actuated on the eval seeds.
- ``train``: each algorithm and training seed trains for ``--steps`` env steps (the config otherwise as shipped),
  then its final greedy policy plays the eval seeds.

    python bench/sumo_signals.py --part speed baselines train --algos dqn --seeds 0 1 2 --steps 30000
    python bench/sumo_signals.py --report
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch/numpy load: every run single-threaded (2-core machine)

import argparse
import datetime
import glob
import json
import shlex
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH_DIR)
# not named sumo.py: with bench/ on sys.path (a script's folder, or the bench harness tests'), `import sumo` would
# import the script instead of the eclipse-sumo package
sys.path.insert(0, ROOT)

RESULTS_DIR = os.path.join(BENCH_DIR, "results", "sumo")
CONFIGS = {a: os.path.join(ROOT, "app_zoo", "sumo", "config", f"single_intersection_{a}.yaml") for a in ("dqn", "ppo")}
EVAL_SEEDS = list(range(1000, 1010))  # held out: training uses env seeds seed + i and seed + 100000 + i
METRIC = "vehicle_waiting_time"
FIGURES = ("vehicle_waiting_time", "mean_waiting_time", "mean_stopped", "mean_speed", "vehicles")

SPEED_SCRIPT = """
import json, os, resource, sys, time
import sumo
os.environ.setdefault("SUMO_HOME", sumo.SUMO_HOME)
import sumo_rl, traci
from sumo_rl.environment import env as E
d = os.path.join(os.path.dirname(sumo_rl.__file__), "nets", "single-intersection")
env = sumo_rl.SumoEnvironment(net_file=os.path.join(d, "single-intersection.net.xml"),
    route_file=os.path.join(d, "single-intersection.rou.xml"), single_agent=True, num_seconds=3600, sumo_seed=1,
    sumo_warnings=False, fixed_ts=True, add_per_agent_info=False, additional_sumo_cmd="--no-step-log")
def cpu():
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime
env.reset()
start, cpu0, n, done = time.perf_counter(), cpu(), 0, False
while not done:
    _, _, term, trunc, _ = env.step(0)
    n, done = n + 1, term or trunc
elapsed = time.perf_counter() - start
env.close()  # TraCI: the sumo process exits, so its CPU time is counted in RUSAGE_CHILDREN
cpu_s = cpu() - cpu0
print(json.dumps(dict(libsumo=E.LIBSUMO, env_steps=n, seconds=elapsed, cpu_seconds=cpu_s, env_steps_per_s=n / elapsed,
                      env_steps_per_cpu_s=n / cpu_s, sim_seconds_per_s=3600 / elapsed)))
"""


def machine() -> Dict[str, Any]:
    """Where a record was measured: ``bench/zoo.py``'s description with SUMO's versions, and the load average."""
    from zoo import machine_info

    info = machine_info(extra=("eclipse-sumo", "libsumo", "sumo-rl", "pettingzoo"))
    info["load_average"] = os.getloadavg()
    return info


def command_line() -> str:
    return "python bench/sumo_signals.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])


def save(name: str, record: Dict[str, Any]) -> str:
    os.makedirs(RESULTS_DIR, exist_ok=True)
    record = dict(record, date=datetime.date.today().isoformat(), command=command_line(), machine=machine())
    path = os.path.join(RESULTS_DIR, f"{name}.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(record, f, indent=1)
    return path


def summary(episodes: List[Dict[str, Any]]) -> Dict[str, float]:
    return {name: float(np.mean([e[name] for e in episodes])) for name in FIGURES}


def env_config(algo: str = "dqn") -> Dict[str, Any]:
    from nervex.config import read_config

    return dict(read_config(CONFIGS[algo])["env"])


# ---- parts -----------------------------------------------------------------------------------------------------------
def run_speed() -> Dict[str, Any]:
    out = {}
    for backend in ("libsumo", "traci"):
        env = {k: v for k, v in os.environ.items() if k != "LIBSUMO_AS_TRACI"}
        if backend == "libsumo":
            env["LIBSUMO_AS_TRACI"] = "quiet"
        proc = subprocess.run(
            [sys.executable, "-c", SPEED_SCRIPT], env=env, capture_output=True, text=True, timeout=900, check=True
        )
        out[backend] = json.loads(proc.stdout.strip().splitlines()[-1])
        assert out[backend]["libsumo"] == (backend == "libsumo"), out[backend]
        r = out[backend]
        print(f"[speed] {backend}: {r['env_steps_per_s']:.0f} env steps/s, {r['env_steps_per_cpu_s']:.0f} per CPU s")
    out["ratio"] = out["libsumo"]["env_steps_per_s"] / out["traci"]["env_steps_per_s"]
    out["cpu_ratio"] = out["libsumo"]["env_steps_per_cpu_s"] / out["traci"]["env_steps_per_cpu_s"]
    print(f"[speed] libsumo / traci = {out['ratio']:.1f}x wall, {out['cpu_ratio']:.1f}x CPU", flush=True)
    save("speed", out)
    return out


def run_baselines(seeds: Sequence[int]) -> Dict[str, Any]:
    from app_zoo.sumo.envs.baselines import measure_baselines

    start = time.perf_counter()
    figures = measure_baselines(env_config(), seeds)
    record = dict(eval_seeds=list(seeds), episodes=figures, summary={k: summary(v) for k, v in figures.items()})
    record["seconds"] = time.perf_counter() - start
    for control, s in record["summary"].items():
        print(f"[baselines] {control}: {METRIC} {s[METRIC]:.2f} s, mean_waiting_time {s['mean_waiting_time']:.2f}")
    save("baselines", record)
    return record


def run_train(algo: str, seed: int, steps: int, eval_seeds: Sequence[int]) -> Dict[str, Any]:
    import tempfile

    from app_zoo.sumo.envs.baselines import play_episodes
    from nervex.config import apply_overrides, read_config
    from nervex.entry import SerialTrainer

    over = [f"max_env_step={steps}", f"evaluator.eval_freq={10 * steps}", "learner.hook.log_show_after_iter=1000000"]
    cfg = apply_overrides(read_config(CONFIGS[algo]), over)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as run_root:
        with SerialTrainer(cfg, seed=seed, run_root=run_root) as trainer:
            result = trainer.run(progress=False)
            train_s = time.perf_counter() - start
            episodes = play_episodes(trainer.cfg.env, eval_seeds, act=lambda obs: trainer.compute_single_action(obs))
    record = dict(
        algo=algo,
        seed=seed,
        steps=int(result["env_step"]),
        train_iter=int(result["train_iter"]),
        train_seconds=train_s,
        eval_seconds=time.perf_counter() - start - train_s,
        eval_seeds=list(eval_seeds),
        episodes=episodes,
        summary=summary(episodes),
        final_rollout={k: v for k, v in result.items() if k.startswith("rollout/")},
    )
    print(
        f"[train] {algo} seed {seed}: {METRIC} {record['summary'][METRIC]:.2f} s after {record['steps']} steps "
        f"({train_s:.0f} s)",
        flush=True,
    )
    save(f"{algo}__seed{seed}", record)
    return record


# ---- report ----------------------------------------------------------------------------------------------------------
def load(pattern: str) -> List[Dict[str, Any]]:
    out = []
    for path in sorted(glob.glob(os.path.join(RESULTS_DIR, pattern))):
        with open(path, encoding="utf-8") as f:
            out.append(json.load(f))
    return out


def report() -> str:
    lines = []
    (base,) = load("baselines.json") or [None]
    runs = load("*__seed*.json")
    if base is not None:
        fixed, actuated = (base["summary"][c][METRIC] for c in ("fixed", "actuated"))
        per_seed_actuated = [e[METRIC] for e in base["episodes"]["actuated"]]
        lines += [
            f"| controller | training seed | env steps | {METRIC} (s) | vs fixed | vs actuated | eval seeds below "
            "actuated | sumo-rl mean_waiting_time (s) | mean stopped | training time |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for name in ("fixed", "actuated"):
            s = base["summary"][name]
            lines.append(
                f"| {name} | - | - | {s[METRIC]:.2f} | {s[METRIC] / fixed:.2f} | {s[METRIC] / actuated:.2f} | - | "
                f"{s['mean_waiting_time']:.2f} | {s['mean_stopped']:.1f} | - |"
            )
        by_algo: Dict[str, List[float]] = {}
        for run in runs:
            s = run["summary"]
            by_algo.setdefault(run["algo"], []).append(s[METRIC])
            below = sum(e[METRIC] < a for e, a in zip(run["episodes"], per_seed_actuated))
            lines.append(
                f"| {run['algo']} | {run['seed']} | {run['steps']} | {s[METRIC]:.2f} | {s[METRIC] / fixed:.2f} | "
                f"{s[METRIC] / actuated:.2f} | {below}/{len(run['episodes'])} | {s['mean_waiting_time']:.2f} | "
                f"{s['mean_stopped']:.1f} | {run['train_seconds'] / 60:.0f} min |"
            )
        for algo, values in by_algo.items():
            m = float(np.mean(values))
            ratios = f"{m / fixed:.2f} | {m / actuated:.2f}"
            lines.append(f"| **{algo}, mean of {len(values)}** | | | **{m:.2f}** | {ratios} | | | | |")
    (speed,) = load("speed.json") or [None]
    if speed is not None:
        lib, tra = speed["libsumo"], speed["traci"]
        lines.append(
            f"\nsumo-rl's SumoEnvironment, one 3600-s fixed-time episode (720 env steps): libsumo "
            f"{lib['env_steps_per_s']:.0f} env steps/s wall ({lib['env_steps_per_cpu_s']:.0f} per CPU second), TraCI "
            f"{tra['env_steps_per_s']:.0f} wall ({tra['env_steps_per_cpu_s']:.0f} per CPU second, sumo process "
            f"included): {speed['ratio']:.1f}x wall, {speed['cpu_ratio']:.1f}x CPU"
        )
    return "\n".join(lines)


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--part", nargs="*", default=[], choices=("speed", "baselines", "train"))
    p.add_argument("--algos", nargs="+", default=["dqn"], choices=sorted(CONFIGS))
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=30000)
    p.add_argument("--eval-seeds", nargs="+", type=int, default=EVAL_SEEDS)
    p.add_argument("--report", action="store_true")
    return p.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    if "speed" in args.part:
        run_speed()
    if "baselines" in args.part:
        run_baselines(args.eval_seeds)
    if "train" in args.part:
        for algo in args.algos:
            for seed in args.seeds:
                run_train(algo, seed, args.steps, args.eval_seeds)
    if args.report or not args.part:
        print(report())
    return 0


if __name__ == "__main__":
    sys.exit(main())
