"""Cooperative multi-agent benchmarks: nervex's QMIX, VDN, COMA, MAPPO and ATOC, and BenchMARL on VMAS.

Parts (each saves one JSON record per (part, algorithm, library, seed) under ``bench/results/marl/`` as soon as it
finishes; ``--report`` renders the table in ``docs/benchmarks.md`` between the ``marl`` markers and the learning
curves ``docs/marl_{part}.png`` from every saved record):

- ``spread``: mpe2 ``simple_spread_v3``, 3 agents, 25 cycles, discrete. The random policy and the assignment
  heuristic (each agent steers to its landmark by a minimum-cost assignment) are measured on the same env; returns
  are reported raw (the team return: the **sum over agents** of 25 steps) and as the fraction of the
  random -> heuristic gap closed. Targets: QMIX, VDN and MAPPO >= 0.8 within 2M env steps; COMA >= 0.5.
- ``lbf``: lbforaging ``Foraging-8x8-2p-2f-coop-v3`` (50 steps): the normalized return (1.0 = all food eaten).
  Target: QMIX and MAPPO >= 0.95.
- ``atoc``: 5-agent continuous simple_spread: ATOC against independent DDPG with shared parameters, same budget.
- ``vmas``: VMAS ``simple_spread`` with BenchMARL's default task settings: nervex's QMIX and MAPPO against
  BenchMARL's QMIX and MAPPO (its default experiment config) for the same wall-clock budget on one thread,
  interleaved per seed; evaluation returns and frames per second of collection and training on both sides.

    python bench/marl.py --part spread --algos qmix vdn mappo coma --seeds 0 1 2 --steps 2000000
    python bench/marl.py --part vmas --algos qmix mappo --seeds 0 1 2 --seconds 600
    python bench/marl.py --report
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch/numpy load: every run single-threaded (2-core machine)

import argparse
import datetime
import glob
import json
import shlex
import shutil
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence

import numpy as np

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH_DIR)
sys.path.insert(0, ROOT)
sys.path.insert(0, BENCH_DIR)

from nervex.entry.callbacks import DefaultCallbacks  # noqa: E402

RESULTS_DIR = os.path.join(ROOT, "bench", "results", "marl")
DOCS_FILE = os.path.join(ROOT, "docs", "benchmarks.md")
HEADING = "## Cooperative multi-agent: nervex's QMIX, VDN, COMA, MAPPO, ATOC; BenchMARL on VMAS"
BEGIN, END = "<!-- marl:begin -->", "<!-- marl:end -->"


@dataclass(frozen=True)
class Part:
    """One benchmark: its configs per algorithm, the default budget and how returns are normalized."""

    name: str
    configs: Mapping[str, str]
    steps: int
    eval_freq: int
    n_eval: int
    target: Mapping[str, float]
    metric: str  # 'gap' (fraction of random->heuristic closed), 'normalized' (env's figure), 'raw'


PARTS: Dict[str, Part] = {
    "spread": Part(
        "spread",
        {a: f"app_zoo/multiagent/mpe/config/simple_spread_{a}.yaml" for a in ("qmix", "vdn", "mappo", "coma")},
        2_000_000,
        50_000,
        32,
        {"qmix": 0.8, "vdn": 0.8, "mappo": 0.8, "coma": 0.5},
        "gap",
    ),
    "lbf": Part(
        "lbf",
        {a: f"app_zoo/multiagent/lbf/config/lbf_8x8_2p_2f_coop_{a}.yaml" for a in ("qmix", "mappo")},
        2_000_000,
        50_000,
        32,
        {"qmix": 0.95, "mappo": 0.95},
        "normalized",
    ),
    "atoc": Part(
        "atoc",
        {a: f"app_zoo/multiagent/mpe/config/simple_spread5_{a}.yaml" for a in ("atoc", "ddpg")},
        1_000_000,
        25_000,
        32,
        {},
        "raw",
    ),
    "vmas": Part(
        "vmas",
        {a: f"app_zoo/multiagent/vmas/config/vmas_simple_spread_{a}.yaml" for a in ("qmix", "mappo")},
        10_000_000,
        60_000,
        10,
        {},
        "raw",
    ),
}


# ---- records -------------------------------------------------------------------------------------------------------
def record_path(part: str, algo: str, lib: str, seed: int) -> str:
    return os.path.join(RESULTS_DIR, f"{part}__{algo}__{lib}__seed{seed}.json")


def save_record(record: Dict[str, Any], out: Optional[str] = None) -> str:
    os.makedirs(out or RESULTS_DIR, exist_ok=True)
    path = record_path(record["part"], record["algo"], record["lib"], record["seed"])
    if out:
        path = os.path.join(out, os.path.basename(path))
    with open(path, "w", encoding="utf-8") as f:
        json.dump(record, f, indent=1)
    return path


def load_records() -> List[Dict[str, Any]]:
    out = []
    for path in sorted(glob.glob(os.path.join(RESULTS_DIR, "*__*__*__seed*.json"))):  # not spread_baselines.json
        with open(path, encoding="utf-8") as f:
            out.append(json.load(f))
    return out


def machine() -> Dict[str, Any]:
    from zoo import machine_info

    return machine_info(extra=("pettingzoo", "mpe2", "lbforaging", "vmas", "benchmarl", "torchrl"))


def command_line(argv: Optional[Sequence[str]] = None) -> str:
    """The command that reproduces a record: ``--out DIR`` and ``--verbose`` (where records go, what is printed)
    do not change a run and are left out."""
    args, kept = list(sys.argv[1:] if argv is None else argv), []
    while args:
        arg = args.pop(0)
        if arg == "--out" and args:
            args.pop(0)  # its value
        elif arg != "--out" and not arg.startswith("--out=") and arg != "--verbose":
            kept.append(arg)
    return "python bench/marl.py " + " ".join(shlex.quote(a) for a in kept)


# ---- the nervex side -----------------------------------------------------------------------------------------------
class Timer(DefaultCallbacks):
    """Seconds spent collecting and training, split by the trainer's ``on_sample_end`` callback."""

    def __init__(self) -> None:
        super().__init__()
        self.collect = 0.0
        self.train = 0.0
        self._start = 0.0
        self._sampled = 0.0

    def begin(self) -> None:
        self._start = time.perf_counter()

    def on_sample_end(self, trainer: Any, samples: Any) -> None:
        self._sampled = time.perf_counter()
        self.collect += self._sampled - self._start

    def end(self, eval_secs: float) -> None:
        self.train += time.perf_counter() - self._sampled - eval_secs


def run_nervex(
    config: str,
    seed: int,
    steps: int,
    seconds: Optional[float],
    eval_freq: int,
    n_eval: int,
    overrides: Sequence[str] = (),
    verbose: bool = False,
    keep_dir: Optional[str] = None,
) -> Dict[str, Any]:
    """Train nervex's config until ``steps`` env steps or ``seconds`` of wall clock (evaluation included).

    Returns:
        ``curve`` (env_step, wall seconds, eval mean return and the eval figures of the env), frames per second of
        collection and of training, the resolved config.
    """
    from nervex.config import apply_overrides, read_config, to_plain
    from nervex.entry import SerialTrainer

    over = [f"max_env_step={steps}", f"evaluator.eval_freq={eval_freq}", f"evaluator.n_episode={n_eval}"]
    over += ["evaluator.stop_val=1000000000000.0", *overrides]
    cfg = apply_overrides(read_config(os.path.join(ROOT, config)), over)
    timer = Timer()
    curve: List[Dict[str, float]] = []
    with tempfile.TemporaryDirectory() as run_root:
        with SerialTrainer(cfg, seed=seed, exp_name=f"marl_{seed}", run_root=run_root, callbacks=timer) as trainer:
            trainer.logger.setLevel("WARNING")
            start = time.perf_counter()
            while not trainer.stopped:
                eval_before = trainer.evaluator.eval_time
                timer.begin()
                result = trainer.train()
                timer.end(trainer.evaluator.eval_time - eval_before)
                wall = time.perf_counter() - start  # evaluation included, as BenchMARL's budget includes its own
                if "eval/mean_reward" in result:
                    point = {"env_step": int(result["env_step"]), "wall_secs": wall}
                    point.update({k[5:]: float(v) for k, v in result.items() if k.startswith("eval/")})
                    curve.append(point)
                    if verbose:
                        print(f"  {point['env_step']} steps, {wall:.0f} s: eval {point['mean_reward']:.3f}", flush=True)
                if seconds is not None and wall >= seconds:
                    # the last point of the curve, at the budget (not charged to it, as on BenchMARL's side)
                    point = {"env_step": int(trainer.env_step), "wall_secs": min(wall, seconds)}
                    point.update({k[5:]: float(v) for k, v in trainer.loop.evaluate().items() if k.startswith("eval/")})
                    curve.append(point)
                    break
            out = dict(
                env_steps=int(trainer.env_step),
                curve=curve,
                collect_fps=trainer.env_step / max(timer.collect, 1e-9),
                train_fps=trainer.env_step / max(timer.train, 1e-9),
                train_secs=timer.collect + timer.train,
                config=dict(path=config, overrides=over, resolved=to_plain(trainer.cfg)),
            )
        if keep_dir:  # the run directory (checkpoint, logs, eval.csv), after the trainer closed it
            shutil.copytree(os.path.join(run_root, f"marl_{seed}"), keep_dir, dirs_exist_ok=True)
    return out


REFERENCES = {
    "nearest": "every agent to its nearest landmark (no coordination)",
    "fixed": "agent i to landmark i (a fixed convention)",
}


# ---- baselines of the spread part ----------------------------------------------------------------------------------
def spread_baselines(episodes: int = 200, seed: int = 12345) -> Dict[str, float]:
    """The team return (sum over agents, 25 steps) of the random policy and of the assignment heuristic (the gap's
    ends), and of the reference points between them: ``nearest`` (every agent to its nearest landmark, no
    coordination) and ``fixed`` (agent i to landmark i, a convention an agent-id-conditioned policy can learn)."""
    from app_zoo.multiagent.mpe.envs import measure_spread_baselines

    policies = ("random", "heuristic", *REFERENCES)
    return dict(measure_spread_baselines(episodes=episodes, seed=seed, policies=policies), episodes=episodes, seed=seed)


def gap_fraction(value: float, base: Mapping[str, float]) -> float:
    """How much of the random -> heuristic gap a return closes: 0 = random, 1 = heuristic."""
    from app_zoo.multiagent.mpe.envs import gap_closed

    return gap_closed(value, base)


def run_peer(algo: str, seed: int, seconds: float) -> Dict[str, Any]:
    """BenchMARL's ``algo`` with its default experiment config for ``seconds`` of wall clock (``bench/marl_benchmarl``),
    as a record in this script's layout: the curve's wall time includes BenchMARL's evaluations, as nervex's does."""
    from marl_benchmarl import run_benchmarl

    with tempfile.TemporaryDirectory() as out_dir:
        out = run_benchmarl(algo, seed, seconds, out_dir)
    curve = [{"wall_secs": w, "env_step": int(f), "mean_reward": float(r)} for w, f, r in out["curve"]]
    return dict(
        env_steps=int(out["frames"]),
        curve=curve,
        collect_fps=out["collect_fps"],
        train_fps=out["frames_collected"] / out["train_s"] if out["train_s"] else float("nan"),
        train_secs=out["collect_s"] + out["train_s"],
        config=dict(path="benchmarl defaults (conf/experiment/base_experiment.yaml, algorithm, vmas/simple_spread)"),
        peer=dict((k, v) for k, v in out.items() if k != "curve"),
    )


# ---- running -------------------------------------------------------------------------------------------------------
def run_one(part: Part, algo: str, lib: str, seed: int, args: argparse.Namespace) -> Dict[str, Any]:
    steps = args.steps or part.steps
    t0 = time.perf_counter()
    if lib == "nervex":
        out = run_nervex(
            part.configs[algo],
            seed,
            steps,
            args.seconds,
            args.eval_freq or part.eval_freq,
            args.n_eval or part.n_eval,
            args.set or (),
            verbose=args.verbose,
            keep_dir=os.path.join(args.out, f"run__{part.name}__{algo}__seed{seed}") if args.out else None,
        )
    else:
        out = run_peer(algo, seed, args.seconds or 600.0)
    return dict(
        part=part.name,
        algo=algo,
        lib=lib,
        seed=seed,
        date=datetime.date.today().isoformat(),
        command=command_line(),
        machine=machine(),
        wall_secs=time.perf_counter() - t0,
        **out,
    )


def run(args: argparse.Namespace) -> bool:
    part = PARTS[args.part]
    libs = ("nervex", "benchmarl") if part.name == "vmas" and not args.nervex_only else ("nervex",)
    ok = True
    if part.metric == "gap" and not os.path.exists(os.path.join(RESULTS_DIR, "spread_baselines.json")):
        base = spread_baselines()
        os.makedirs(RESULTS_DIR, exist_ok=True)
        with open(os.path.join(RESULTS_DIR, "spread_baselines.json"), "w", encoding="utf-8") as f:
            json.dump(dict(base, date=datetime.date.today().isoformat(), command=command_line()), f, indent=1)
    for seed in args.seeds:
        for algo in args.algos or list(part.configs):
            for lib in libs:  # interleaved: every library on a seed before the next seed
                try:
                    rec = run_one(part, algo, lib, seed, args)
                except Exception:  # a crashed run is reported, the others still run
                    traceback.print_exc()
                    ok = False
                    continue
                path = save_record(rec, args.out)
                last = rec["curve"][-1] if rec["curve"] else {}
                print(
                    f"{part.name} {algo} {lib} seed {seed}: {rec['env_steps']} steps, last eval "
                    f"{last.get('mean_reward', float('nan')):.3f}, collect {rec['collect_fps']:.0f} fps, "
                    f"train {rec['train_fps']:.0f} fps -> {path}",
                    flush=True,
                )
    return ok


# ---- report --------------------------------------------------------------------------------------------------------
def final_value(rec: Mapping[str, Any], key: str = "mean_reward", last: int = 3) -> float:
    """The mean of the last ``last`` evaluations (one evaluation is noisy)."""
    values = [p[key] for p in rec["curve"] if key in p][-last:]
    return float(np.mean(values)) if values else float("nan")


def part_lines(part: Part, recs: Sequence[Mapping[str, Any]], base: Optional[Mapping[str, float]]) -> List[str]:
    lines = [
        f"### {part.name}",
        "",
        "| algorithm | library | seeds | env steps | final eval return (per seed) | "
        "normalized | target | collect fps | train fps |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    groups: Dict[tuple, List[Mapping[str, Any]]] = {}
    for r in recs:
        groups.setdefault((r["algo"], r["lib"]), []).append(r)
    for (algo, lib), rs in sorted(groups.items()):
        rs = sorted(rs, key=lambda r: r["seed"])
        # a wall-clock race is judged at the budget: the last evaluation; step budgets by the mean of the last 3
        finals = [final_value(r, last=1 if part.name == "vmas" else 3) for r in rs]
        if part.metric == "gap" and base:
            norm = [gap_fraction(v, base) for v in finals]
        elif part.metric == "normalized":
            norm = [final_value(r, "normalized_return") for r in rs]
        else:
            norm = []
        norm_text = f"{np.mean(norm):.2f} ({', '.join(f'{v:.2f}' for v in norm)})" if norm else "-"
        target = part.target.get(algo)
        lines.append(
            f"| {algo} | {lib} | {','.join(str(r['seed']) for r in rs)} | {int(np.median([r['env_steps'] for r in rs]))} "
            f"| {np.mean(finals):.2f} ({', '.join(f'{v:.2f}' for v in finals)}) | {norm_text} | "
            f"{'-' if target is None else f'>= {target}'} | {np.median([r['collect_fps'] for r in rs]):.0f} | "
            f"{np.median([r['train_fps'] for r in rs]):.0f} |"
        )
    return lines


def plot_part(part: Part, recs: Sequence[Mapping[str, Any]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    x_key = "wall_secs" if part.name == "vmas" else "env_step"
    groups: Dict[tuple, List[Mapping[str, Any]]] = {}
    for r in recs:
        groups.setdefault((r["algo"], r["lib"]), []).append(r)
    for (algo, lib), rs in sorted(groups.items()):
        for i, r in enumerate(rs):
            xs = [p[x_key] for p in r["curve"]]
            ys = [p["mean_reward"] for p in r["curve"]]
            ax.plot(
                xs,
                ys,
                color=f"C{sorted(groups).index((algo, lib))}",
                alpha=0.7,
                label=f"{algo} ({lib})" if i == 0 else None,
            )
    ax.set_xlabel("wall-clock seconds" if x_key == "wall_secs" else "env steps")
    ax.set_ylabel("evaluation team return")
    ax.set_title(f"marl: {part.name} (one line per seed)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def report() -> None:
    from zoo import replace_marked_section

    recs = load_records()
    base = None
    base_path = os.path.join(RESULTS_DIR, "spread_baselines.json")
    if os.path.exists(base_path):
        with open(base_path, encoding="utf-8") as f:
            base = json.load(f)
    body: List[str] = [
        "Targets hold for the issue's budgets (simple_spread and LBF: 2M env steps; ATOC: 1M; VMAS: the same "
        "wall-clock budget for both libraries); a row whose env steps are fewer is a partial run and says where the "
        "curve stood, not whether the target is met. Returns: simple_spread's team return is the sum over agents of "
        "a 25-step episode; VMAS's the per-agent return (every agent gets the team's) of a 100-step episode, as "
        "BenchMARL reports it. `final eval return`: the mean of the last 3 evaluations (VMAS: the evaluation at the "
        "budget), each seed in brackets.",
        "",
    ]
    if base:
        body += [
            f"simple_spread baselines (team return = sum over 3 agents of 25 steps, {base.get('episodes', 200)} "
            f"episodes): random {base['random']:.2f}, assignment heuristic {base['heuristic']:.2f}"
            + "".join(
                f"; {REFERENCES[k]} {base[k]:.2f} ({gap_fraction(base[k], base):.2f} of the gap)"
                for k in REFERENCES
                if k in base
            )
            + ".",
            "",
        ]
    for name, part in PARTS.items():
        part_recs = [r for r in recs if r["part"] == name]
        if not part_recs:
            continue
        body += part_lines(part, part_recs, base) + [""]
        commands = sorted({r["command"] for r in part_recs})
        dates = sorted({r["date"] for r in part_recs})
        m = part_recs[0]["machine"]
        body += [
            f"Measured {', '.join(dates)} on {m['platform']} ({m['cpu_count']} cores) with "
            + "; ".join(f"`{c}`" for c in commands)
            + f". Curves: `docs/marl_{name}.png`.",
            "",
        ]
        plot_part(part, part_recs, os.path.join(ROOT, "docs", f"marl_{name}.png"))
    with open(DOCS_FILE, encoding="utf-8") as f:
        text = f.read()
    with open(DOCS_FILE, "w", encoding="utf-8") as f:
        f.write(replace_marked_section(text, "\n".join(body), HEADING, BEGIN, END))


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--part", choices=sorted(PARTS))
    p.add_argument("--algos", nargs="*")
    p.add_argument("--seeds", nargs="*", type=int, default=[0])
    p.add_argument("--steps", type=int, help="env steps per run (default: the part's budget)")
    p.add_argument("--seconds", type=float, help="wall-clock budget per run (evaluation included)")
    p.add_argument("--eval-freq", type=int)
    p.add_argument("--n-eval", type=int)
    p.add_argument("--set", nargs="*", help="nervex config overrides, dotted")
    p.add_argument(
        "--out", help="save the records and run directories here instead (trials: the report reads bench/results/marl)"
    )
    p.add_argument("--verbose", action="store_true", help="print each evaluation as it comes")
    p.add_argument("--nervex-only", action="store_true", help="vmas: skip BenchMARL")
    p.add_argument("--report", action="store_true", help="render docs/benchmarks.md and the PNGs; run nothing")
    return p.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    if args.report:
        report()
        return 0
    if not args.part:
        print("bench/marl.py: give --part or --report", file=sys.stderr)
        return 2
    ok = run(args)
    if not args.out:
        report()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
