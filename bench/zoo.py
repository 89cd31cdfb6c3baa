"""nervex vs Stable-Baselines3 with rl-baselines3-zoo's hyperparameters, row by row (env x algorithm).

nervex trains its shipped YAML config; SB3 trains with the zoo's settings for the same env, read at run time from the
installed rl_zoo3 (see ``bench/zoo_sb3.py``), or, for an env the zoo has no entry for, with SB3's defaults and the
few settings the row lists (``Row.sb3_settings``). Both run in this process, interleaved (seed 0 nervex, seed 0 SB3,
seed 1 nervex, ...), and are evaluated greedily on ``--n-eval`` episodes every ``--eval-freq`` env steps (the same
for both in a row). Per seed: env steps and training seconds (evaluation and set-up excluded) until the evaluation
mean first reaches the row's threshold, and the evaluation curve. Each (row, library, seed) record is saved as JSON
under ``bench/results/zoo/`` as soon as it finishes; the table in ``docs/benchmarks.md`` (between the ``zoo``
markers) and the learning-curve PNGs ``docs/zoo_{row}.png`` are rendered from every saved record.

    python bench/zoo.py --rows cartpole_dqn --seeds 0 1 2 3 4     # run, save, render
    python bench/zoo.py --rows lunarlander_ppo --seeds 3 4         # add seeds to saved results (long rows in pieces)
    python bench/zoo.py --rows cartpole_ppo --until budget         # full curves: no stop at the threshold
    python bench/zoo.py --report                                   # re-render table and PNGs, run nothing
    python bench/zoo.py --throughput cartpole_ppo --steps 50000    # env steps/s of training, no evaluation
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch/numpy load: every run single-threaded (2-core machine)

import argparse
import datetime
import glob
import json
import math
import platform
import shlex
import statistics
import sys
import tempfile
import textwrap
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH_DIR)
sys.path.insert(0, ROOT)
sys.path.insert(0, BENCH_DIR)

RESULTS_DIR = os.path.join(ROOT, "bench", "results", "zoo")
DOCS_FILE = os.path.join(ROOT, "docs", "benchmarks.md")
HEADING = "## Zoo: nervex vs Stable-Baselines3 (rl-zoo settings)"
BEGIN, END = "<!-- zoo:begin -->", "<!-- zoo:end -->"
LIBS = ("nervex", "sb3")
LIB_NAMES = {"nervex": "nervex", "sb3": "SB3"}
NO_EVAL_FREQ = 10**12  # an eval_freq no run reaches: evaluation off


@dataclass(frozen=True)
class Row:
    """One comparison: an env, nervex's config for it, and the zoo entry (or SB3's defaults) SB3 trains with.

    Args:
        name: Row id, used in file names (``bench/results/zoo/{name}__{lib}__seed{seed}.json``, ``docs/zoo_{name}.png``).
        env_id: The Gymnasium id both libraries train on.
        config: nervex's YAML config, relative to the repository root.
        threshold: Evaluation mean that counts as solved.
        budget: Env steps at most (nervex's, and SB3's unless ``sb3_budget``).
        sb3_algo: The zoo's algorithm name (``hyperparams/{sb3_algo}.yml``).
        zoo_key: The zoo's entry (default ``env_id``, unless ``sb3_settings``).
        sb3_budget: SB3's env steps at most, when it differs from ``budget``.
        eval_freq: Env steps between evaluations (both libraries).
        note: Shown under the table.
        throughput_overrides: nervex config overrides for ``--throughput``, so it runs the zoo's hyperparameters
            where the shipped config is tuned differently (the speed figure compares like with like).
        sb3_settings: For an env the zoo has no entry for: SB3 trains with its defaults and these settings over
            them, written as in a zoo entry (``{"noise_type": "normal", "noise_std": 0.1}``; ``{}``: SB3's defaults
            only). None: the zoo's entry ``zoo_entry``.

    Raises:
        ValueError: both ``zoo_key`` and ``sb3_settings`` given.
    """

    name: str
    env_id: str
    config: str
    threshold: float
    budget: int
    sb3_algo: str
    zoo_key: Optional[str] = None
    sb3_budget: Optional[int] = None
    eval_freq: int = 1000
    note: str = ""
    throughput_overrides: Tuple[str, ...] = ()
    sb3_settings: Optional[Mapping[str, Any]] = None

    def __post_init__(self) -> None:
        if self.zoo_key is not None and self.sb3_settings is not None:
            raise ValueError(f"row {self.name}: give zoo_key (a zoo entry) or sb3_settings (SB3's defaults), not both")

    @property
    def zoo_entry(self) -> Optional[str]:
        """The zoo's entry SB3 trains with; None: SB3's defaults with ``sb3_settings``."""
        if self.sb3_settings is not None:
            return None
        return self.zoo_key or self.env_id

    @property
    def sb3_source(self) -> str:
        """Where SB3's settings come from, for notes and titles."""
        if self.zoo_entry is None:
            return f"SB3 `{self.algo}` defaults"
        return f"SB3 rl-zoo `{self.sb3_algo}.yml` entry `{self.zoo_entry}`"

    def sb3_setup(self, learn_timesteps: int) -> Any:
        """SB3's ``zoo_sb3.Sb3Setup`` for a run of ``learn_timesteps`` env steps."""
        from zoo_sb3 import prepare

        return prepare(self.sb3_algo, self.zoo_entry, learn_timesteps, self.sb3_settings)

    def budget_of(self, lib: str) -> int:
        return self.sb3_budget if lib == "sb3" and self.sb3_budget else self.budget

    @property
    def algo(self) -> str:
        """The algorithm label: SB3's, or ``nervex's vs SB3's`` where the two differ (Rainbow vs DQN)."""
        peer = {"ppo_lstm": "RecurrentPPO"}.get(self.sb3_algo, self.sb3_algo.upper())
        ours = self.name.rsplit("_", 1)[-1]
        ours = {"rainbow": "Rainbow", "r2d2": "R2D2", "impala": "IMPALA"}.get(ours, ours.upper())
        return peer if ours == peer else f"{ours} vs {peer}"


CARTPOLE = "app_zoo/classic_control/cartpole/config"
PENDULUM = "app_zoo/classic_control/pendulum/config"
ROWS: Dict[str, Row] = {
    row.name: row
    for row in (
        Row("cartpole_dqn", "CartPole-v1", f"{CARTPOLE}/cartpole_dqn.yaml", 475, 100_000, "dqn"),
        Row(
            "cartpole_ppo",
            "CartPole-v1",
            f"{CARTPOLE}/cartpole_ppo.yaml",
            475,
            100_000,
            "ppo",
            note="nervex's config runs 40 epochs per rollout (tuned on seeds 0-8), the zoo's 20",
            throughput_overrides=("policy.learn.epoch_per_collect=20",),  # the zoo's value: a like-for-like speed
        ),
        Row(
            "cartpole_a2c",
            "CartPole-v1",
            f"{CARTPOLE}/cartpole_a2c.yaml",
            475,
            100_000,
            "a2c",
            sb3_budget=500_000,
            note="SB3's budget is the zoo's n_timesteps for this entry, 500k",
        ),
        Row(
            "pendulum_ppo",
            "Pendulum-v1",
            f"{PENDULUM}/pendulum_ppo.yaml",
            -200,
            100_000,
            "ppo",
            eval_freq=5000,
        ),
        Row(
            "lunarlander_ppo",
            "LunarLander-v3",
            "app_zoo/box2d/config/lunarlander_ppo.yaml",
            200,
            1_000_000,
            "ppo",
            eval_freq=20_000,
        ),
        Row("pendulum_sac", "Pendulum-v1", f"{PENDULUM}/pendulum_sac.yaml", -200, 20_000, "sac"),
        Row("pendulum_td3", "Pendulum-v1", f"{PENDULUM}/pendulum_td3.yaml", -200, 20_000, "td3"),
        Row("pendulum_ddpg", "Pendulum-v1", f"{PENDULUM}/pendulum_ddpg.yaml", -200, 20_000, "ddpg"),
        Row(
            "mountain_car_continuous_sac",
            "MountainCarContinuous-v0",
            "app_zoo/classic_control/mountain_car/config/mountain_car_continuous_sac.yaml",
            90,
            50_000,
            "sac",
            eval_freq=5000,
            note="the zoo's SAC entry uses gSDE (SB3 runs it); nervex has none and draws its squashed Gaussian's noise "
            "from an AR(1) process per env (collect.noise ar1, rho 0.95) instead",
        ),
        Row(
            "inverted_pendulum_ppo",
            "InvertedPendulum-v5",
            "app_zoo/mujoco/config/inverted_pendulum_ppo.yaml",
            950,
            300_000,
            "ppo",
            zoo_key="InvertedPendulum-v2",
            eval_freq=5000,
            note="the zoo has no InvertedPendulum-v5 entry: SB3 trains v5 with the zoo's InvertedPendulum-v2 settings",
        ),
        Row(
            "inverted_pendulum_td3",
            "InvertedPendulum-v5",
            "app_zoo/mujoco/config/inverted_pendulum_td3.yaml",
            950,
            100_000,
            "td3",
            eval_freq=1000,
            sb3_settings=dict(noise_type="normal", noise_std=0.1),
            note="the zoo has no InvertedPendulum entry for TD3: SB3 trains with its defaults ([400, 300] nets, "
            "learning rate 1e-3, batch 256, 100 random warm-up steps, one gradient step per env step) and Gaussian "
            "action noise 0.1, as the zoo's MuJoCo TD3 entries (SB3's default is none)",
        ),
        Row(
            "inverted_pendulum_sac",
            "InvertedPendulum-v5",
            "app_zoo/mujoco/config/inverted_pendulum_sac.yaml",
            950,
            100_000,
            "sac",
            eval_freq=1000,
            sb3_settings={},
            note="the zoo has no InvertedPendulum entry for SAC: SB3 trains with its defaults ([256, 256] nets, "
            "learning rate 3e-4, batch 256, 100 random warm-up steps, one gradient step per env step, automatic "
            "entropy tuning)",
        ),
        Row(
            "cartpole_rainbow",
            "CartPole-v1",
            f"{CARTPOLE}/cartpole_rainbow.yaml",
            475,
            100_000,
            "dqn",
            note="SB3 has no Rainbow: the peer is SB3 DQN with the zoo's CartPole-v1 DQN settings (the cartpole_dqn "
            "row's); issue 10's target for Rainbow is 475 within 20k env steps",
        ),
        Row(
            "lunarlander_rainbow",
            "LunarLander-v3",
            "app_zoo/box2d/config/lunarlander_rainbow.yaml",
            200,
            300_000,
            "dqn",
            eval_freq=10_000,
            note="SB3 has no Rainbow: the peer is SB3 DQN with the zoo's LunarLander-v3 DQN settings, given the same "
            "300k env steps (the zoo trains it for 100k)",
        ),
        Row(
            "cartpole_no_vel_r2d2",
            "CartPoleNoVel-v1",
            f"{CARTPOLE}/cartpole_r2d2.yaml",
            475,
            100_000,
            "ppo_lstm",
            eval_freq=2000,
            note="velocity-masked CartPole (cart and pole velocities zeroed); the peer is sb3-contrib's RecurrentPPO with "
            "the zoo's ppo_lstm CartPoleNoVel-v1 settings",
        ),
        Row(
            "cartpole_impala",
            "CartPole-v1",
            f"{CARTPOLE}/cartpole_impala.yaml",
            450,
            200_000,
            "ppo",
            eval_freq=2000,
            note="SB3 has no IMPALA: the peer is SB3 PPO with the zoo's CartPole-v1 settings",
        ),
        Row(
            "cartpole_no_vel_impala",
            "CartPoleNoVel-v1",
            f"{CARTPOLE}/cartpole_no_vel_impala.yaml",
            350,
            200_000,
            "ppo_lstm",
            eval_freq=2000,
            note="IMPALA with an LSTM on the velocity-masked CartPole; the peer is sb3-contrib's RecurrentPPO with the "
            "zoo's ppo_lstm CartPoleNoVel-v1 settings",
        ),
    )
}


# ---- records --------------------------------------------------------------------------------------------------------
def record_path(results_dir: str, row: str, lib: str, seed: int) -> str:
    return os.path.join(results_dir, f"{row}__{lib}__seed{seed}.json")


def save_record(results_dir: str, record: Dict[str, Any]) -> str:
    os.makedirs(results_dir, exist_ok=True)
    path = record_path(results_dir, record["row"], record["lib"], record["seed"])
    with open(path, "w", encoding="utf-8") as f:
        json.dump(record, f, indent=1)
    return path


def load_records(results_dir: str) -> Dict[str, Dict[str, List[Dict[str, Any]]]]:
    """Saved records as ``{row: {lib: [record, ...] sorted by seed}}``."""
    out: Dict[str, Dict[str, List[Dict[str, Any]]]] = {}
    for path in sorted(glob.glob(os.path.join(results_dir, "*.json"))):
        with open(path, encoding="utf-8") as f:
            rec = json.load(f)
        out.setdefault(rec["row"], {}).setdefault(rec["lib"], []).append(rec)
    for libs in out.values():
        for recs in libs.values():
            recs.sort(key=lambda r: r["seed"])
    return out


def machine_info(extra: Sequence[str] = ()) -> Dict[str, Any]:
    """Where a record was measured: platform, cores, versions (of the zoo's packages and of ``extra`` ones)."""
    from importlib.metadata import PackageNotFoundError, version

    versions = {}
    for pkg in ("torch", "numpy", "gymnasium", "stable_baselines3", "sb3_contrib", "rl_zoo3", *extra):
        try:
            versions[pkg] = version(pkg)
        except PackageNotFoundError:
            versions[pkg] = None
    return dict(
        platform=platform.platform(),
        machine=platform.machine(),
        cpu_count=os.cpu_count(),
        python=platform.python_version(),
        versions=versions,
    )


def command_line() -> str:
    return "python bench/zoo.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])


# ---- the nervex side -------------------------------------------------------------------------------------------------
def nervex_config(row: Row, budget: int, eval_freq: int, n_eval: int, stop_val: float) -> Tuple[Any, List[str]]:
    """nervex's shipped config for the row with the benchmark's budget and evaluation settings laid over it."""
    from nervex.config import apply_overrides, read_config

    cfg = read_config(os.path.join(ROOT, row.config))
    overrides = [
        f"max_env_step={budget}",
        f"evaluator.eval_freq={eval_freq}",
        f"evaluator.n_episode={n_eval}",
        f"evaluator.stop_val={float(stop_val):f}",  # plain digits: YAML reads 1e+18 as a string
    ]
    return apply_overrides(cfg, overrides), overrides


def run_nervex(
    row: Row,
    seed: int,
    eval_freq: int,
    n_eval: int,
    stop_at: Optional[float],
    on_eval: Callable[[int, float, float], None],
) -> Dict[str, Any]:
    """Train nervex's config, calling ``on_eval(env_step, mean_reward, train_secs)`` after each evaluation."""
    from nervex.config import to_plain
    from nervex.entry import SerialTrainer

    stop_val = float(stop_at) if stop_at is not None else 1.0e18
    cfg, overrides = nervex_config(row, row.budget, eval_freq, n_eval, stop_val)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as run_root:
        with SerialTrainer(cfg, seed=seed, exp_name=f"zoo_{row.name}_{seed}", run_root=run_root) as trainer:
            trainer.logger.setLevel("WARNING")
            setup_secs = time.perf_counter() - t0
            start = time.perf_counter()
            for result in trainer:
                if "eval/mean_reward" in result:
                    train_secs = time.perf_counter() - start - trainer.evaluator.eval_time
                    on_eval(int(result["env_step"]), float(result["eval/mean_reward"]), train_secs)
            train_secs = time.perf_counter() - start - trainer.evaluator.eval_time
            return dict(
                env_steps=int(trainer.env_step),
                train_secs=train_secs,
                eval_secs=trainer.evaluator.eval_time,
                setup_secs=setup_secs,
                config=dict(path=row.config, overrides=overrides, resolved=to_plain(trainer.cfg)),
            )


# ---- one record ------------------------------------------------------------------------------------------------------
@dataclass
class RunOptions:
    eval_freq: Optional[int]
    n_eval: int
    until: str  # 'threshold' or 'budget'
    results_dir: str
    peer_max_train_secs: Optional[float] = None  # stop SB3 after this much training time (a slow peer)


def run_record(row: Row, lib: str, seed: int, opts: RunOptions) -> Dict[str, Any]:
    """Train one library on one seed of a row and return its record (not yet saved)."""
    eval_freq = opts.eval_freq or row.eval_freq
    stop_at = row.threshold if opts.until == "threshold" else None
    curve: Dict[str, List[float]] = {"env_step": [], "mean_reward": [], "train_secs": []}
    reached: Dict[str, Optional[float]] = {"steps": None, "secs": None}
    tag = f"{row.name} {LIB_NAMES[lib]} seed {seed}"

    def on_eval(env_step: int, mean: float, train_secs: float) -> None:
        curve["env_step"].append(env_step)
        curve["mean_reward"].append(mean)
        curve["train_secs"].append(round(train_secs, 3))
        if reached["steps"] is None and mean >= row.threshold:
            reached.update(steps=env_step, secs=train_secs)
        print(f"  {tag}: env_step {env_step:>9,} eval {mean:9.2f} (training {train_secs:7.1f}s)", flush=True)

    wall = time.perf_counter()
    if lib == "nervex":
        out = run_nervex(row, seed, eval_freq, opts.n_eval, stop_at, on_eval)
    else:
        from zoo_sb3 import run_sb3

        setup = row.sb3_setup(row.budget_of("sb3"))
        out = run_sb3(
            setup,
            row.env_id,
            seed,
            row.budget_of("sb3"),
            eval_freq,
            opts.n_eval,
            stop_at,
            on_eval,
            max_train_secs=opts.peer_max_train_secs,
        )
        out["config"] = dict(
            zoo_file=None if row.zoo_entry is None else f"rl_zoo3/hyperparams/{row.sb3_algo}.yml",
            zoo_key=row.zoo_entry,
            zoo_entry=setup.zoo_entry,
            sb3_settings=None if row.sb3_settings is None else dict(row.sb3_settings),
            n_envs=setup.n_envs,
            normalize=setup.normalize,
            notes=setup.notes,
            resolved=out["resolved"],
        )
    return dict(
        row=row.name,
        lib=lib,
        seed=seed,
        env_id=row.env_id,
        algo=row.sb3_algo,
        threshold=row.threshold,
        budget=row.budget_of(lib),
        until=opts.until,
        max_train_secs=opts.peer_max_train_secs if lib == "sb3" else None,
        eval_freq=eval_freq,
        n_eval=opts.n_eval,
        reached=reached["steps"] is not None,
        steps_to_threshold=reached["steps"],
        secs_to_threshold=None if reached["secs"] is None else round(reached["secs"], 3),
        total_env_steps=out["env_steps"],
        train_secs=round(out["train_secs"], 3),
        eval_secs=round(out["eval_secs"], 3),
        setup_secs=round(out["setup_secs"], 3),
        wall_secs=round(time.perf_counter() - wall, 3),
        curve=curve,
        config=out["config"],
        date=datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        command=command_line(),
        machine=machine_info(),
    )


def run_rows(rows: Sequence[Row], seeds: Sequence[int], libs: Sequence[str], opts: RunOptions) -> bool:
    """Run every (row, seed, lib), interleaved by seed, saving each record at once; False if a row failed."""
    ok = True
    for row in rows:
        if not os.path.exists(os.path.join(ROOT, row.config)):
            print(f"skipping {row.name}: nervex config {row.config} does not exist (yet)", flush=True)
            continue
        print(f"== {row.name}: {row.env_id}, threshold {row.threshold:g}, seeds {list(seeds)}", flush=True)
        try:
            for seed in seeds:
                for lib in libs:
                    rec = run_record(row, lib, seed, opts)
                    path = save_record(opts.results_dir, rec)
                    print(f"{row.name} {LIB_NAMES[lib]} seed {seed}: {record_line(rec)}; saved {path}", flush=True)
        except Exception:
            ok = False
            traceback.print_exc()
            print(f"row {row.name} aborted (the records saved before the error are kept)", flush=True)
    return ok


def record_line(rec: Mapping[str, Any]) -> str:
    steps = "not reached" if not rec["reached"] else f"{rec['steps_to_threshold']:,} steps"
    secs = "" if not rec["reached"] else f", {rec['secs_to_threshold']:.1f}s training"
    return (
        f"threshold {rec['threshold']:g} {steps}{secs}; ran {rec['total_env_steps']:,} steps, training "
        f"{rec['train_secs']:.1f}s, eval {rec['eval_secs']:.1f}s, total wall {rec['wall_secs']:.1f}s"
    )


# ---- summaries -------------------------------------------------------------------------------------------------------
def median_inf(values: Sequence[Optional[float]]) -> float:
    """Median over seeds; a seed that never reached the threshold (None) counts as infinitely slow."""
    return statistics.median([math.inf if v is None else float(v) for v in values])


def compact_steps(steps: Optional[float]) -> str:
    """``6000`` -> ``6k``, ``12500`` -> ``12.5k``, ``1000000`` -> ``1M``, None -> ``-``."""
    if steps is None or math.isinf(steps):
        return "-"
    for unit, size in (("M", 1_000_000), ("k", 1_000)):
        if steps >= size:
            return f"{steps / size:.3g}{unit}"
    return f"{steps:.0f}"


def ratio_text(sb3: float, nervex: float, sb3_budget: float, nervex_budget: float) -> str:
    """SB3 / nervex for medians that may be infinite (not reached): a bound when one side did not reach it."""
    if math.isinf(sb3) and math.isinf(nervex):
        return "n/a"
    if math.isinf(sb3):
        return f"> {sb3_budget / nervex:.2f}x" if nervex > 0 and not math.isinf(sb3_budget) else "n/a"
    if math.isinf(nervex):
        return f"< {sb3 / nervex_budget:.2f}x"
    return f"{sb3 / nervex:.2f}x" if nervex > 0 else "n/a"


@dataclass
class LibSummary:
    n_seeds: int
    n_reached: int
    median_steps: float
    median_secs: float
    per_seed: List[Tuple[int, Optional[int]]]  # (seed, steps to threshold or None)
    budget: int
    secs_cap: Optional[float] = None  # training-time cap of seeds stopped by it before the threshold (None: none)


def time_capped(rec: Mapping[str, Any]) -> bool:
    """A seed stopped by ``--peer-max-train-secs`` before reaching the threshold or its step budget."""
    cap = rec.get("max_train_secs")
    return bool(cap) and not rec["reached"] and rec["total_env_steps"] < rec["budget"]


def summarize(records: Sequence[Mapping[str, Any]]) -> LibSummary:
    """The table's figures for one library of one row."""
    caps = [float(r["max_train_secs"]) for r in records if time_capped(r)]
    return LibSummary(
        n_seeds=len(records),
        n_reached=sum(bool(r["reached"]) for r in records),
        median_steps=median_inf([r["steps_to_threshold"] for r in records]),
        median_secs=median_inf([r["secs_to_threshold"] for r in records]),
        per_seed=[(r["seed"], r["steps_to_threshold"]) for r in records],
        budget=max(r["budget"] for r in records),
        secs_cap=min(caps) if caps else None,
    )


def summary_ratios(nx: LibSummary, sb: LibSummary) -> Tuple[str, str]:
    """SB3 / nervex of the median steps and training seconds. A median SB3 seed stopped by the time cap bounds the
    seconds ratio by the cap and leaves the steps ratio unknown (more time might have reached it within the budget)."""
    if math.isinf(sb.median_secs) and sb.secs_cap is not None:
        return "n/a (time cap)", ratio_text(sb.median_secs, nx.median_secs, sb.secs_cap, math.inf)
    steps = ratio_text(sb.median_steps, nx.median_steps, sb.budget, nx.budget)
    return steps, ratio_text(sb.median_secs, nx.median_secs, math.inf, math.inf)


def fmt_median(value: float, unit: str) -> str:
    if math.isinf(value):
        return "not reached"
    return f"{value:,.0f}" if unit == "steps" else f"{value:.1f}"


def table_line(row: Row, sums: Mapping[str, LibSummary]) -> str:
    """One markdown table line: both libraries' figures and the ratios."""
    cells = [f"{row.name}", f"{row.env_id} {row.algo}", f"{row.threshold:g}"]
    for lib in LIBS:
        s = sums.get(lib)
        if s is None:
            cells += ["-", "-", "-"]
            continue
        cells += [f"{s.n_reached}/{s.n_seeds}", fmt_median(s.median_steps, "steps"), fmt_median(s.median_secs, "s")]
    if "nervex" in sums and "sb3" in sums:
        cells += summary_ratios(sums["nervex"], sums["sb3"])
    else:
        cells += ["-", "-"]
    for lib in LIBS:
        s = sums.get(lib)
        cells.append(" ".join(compact_steps(v) for _, v in s.per_seed) if s else "-")
    return "| " + " | ".join(cells) + " |"


TABLE_HEADER = (
    "| row | env, algorithm | threshold | nervex seeds reached | nervex median steps | nervex median train s "
    "| SB3 seeds reached | SB3 median steps | SB3 median train s | steps SB3/nervex | train s SB3/nervex "
    "| nervex steps per seed | SB3 steps per seed |\n" + "|---" * 13 + "|"
)


def render_table(lines: Sequence[str]) -> str:
    return TABLE_HEADER + "\n" + "\n".join(lines)


# ---- curves ----------------------------------------------------------------------------------------------------------
# The statistics and the drawing are nervex plot's (nervex/tools/curves.py, nervex/tools/plot.py); these two wrappers
# keep this script's names for a record's curve dicts.
def bootstrap_ci(
    values: np.ndarray, n_resamples: int = 2000, level: float = 0.95, seed: int = 0
) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(mean, low, high)`` over seeds: ``nervex.tools.curves.mean_band`` at coverage ``level`` (a fraction).

    Shapes:
        values: ``(n_seeds, n_points)``; each output: ``(n_points,)``.
    """
    from nervex.tools.curves import mean_band

    return mean_band(values, ci=100.0 * level, n_resamples=n_resamples, seed=seed)


def curves_on_grid(curves: Sequence[Mapping[str, Sequence[float]]], grid: np.ndarray) -> np.ndarray:
    """Each seed's evaluation curve linearly interpolated onto ``grid``; NaN before its first evaluation, its last
    value held after its last one (a seed that stopped at the threshold keeps its last evaluation)."""
    from nervex.tools.curves import interpolate

    rows = [interpolate(c["env_step"], c["mean_reward"], grid, hold_last=True) for c in curves]
    return np.stack(rows) if rows else np.full((0, len(grid)), np.nan)


def plot_row(row: Row, libs: Mapping[str, Sequence[Mapping[str, Any]]], path: str) -> None:
    """Mean and 95% bootstrap CI of the evaluation curves over seeds, both libraries, threshold dashed (drawn by
    ``nervex.tools.plot.draw_curves``; seeds that stopped at the threshold hold their last evaluation)."""
    from nervex.tools.curves import group_curve
    from nervex.tools.plot import draw_curves

    colors = {"nervex": "tab:blue", "sb3": "tab:orange"}
    groups, group_colors = [], []
    for lib in LIBS:
        recs = [r for r in libs.get(lib, []) if r["curve"]["env_step"]]
        if not recs:
            continue
        curves = [
            (np.asarray(r["curve"]["env_step"], float), np.asarray(r["curve"]["mean_reward"], float)) for r in recs
        ]
        names = [f"seed {r['seed']}" for r in recs]
        groups.append(group_curve(LIB_NAMES[lib], curves, names, n_points=400, hold_last=True))
        group_colors.append(colors[lib])
    peer = "rl-zoo settings" if row.zoo_entry is not None else "SB3 defaults"
    caption = "mean and 95% bootstrap CI over seeds"
    if any(r["until"] == "threshold" for recs in libs.values() for r in recs):
        caption += "; runs stopped at the threshold hold their last evaluation"
    draw_curves(
        groups,
        path,
        xlabel="env steps",
        ylabel=f"greedy evaluation mean return ({_n_eval(libs)} episodes)",
        title=f"{row.env_id}, {row.algo}: nervex vs SB3 ({peer})",
        show_runs=False,
        hlines=[(row.threshold, f"threshold {row.threshold:g}")],
        caption=caption,
        colors=group_colors,
        legend_loc="lower right",
        run_word="seed",
    )


def _n_eval(libs: Mapping[str, Sequence[Mapping[str, Any]]]) -> str:
    return "/".join(sorted({str(r["n_eval"]) for recs in libs.values() for r in recs}))


# ---- the docs section ------------------------------------------------------------------------------------------------
def replace_marked_section(text: str, body: str, heading: str = HEADING, begin: str = BEGIN, end: str = END) -> str:
    """``text`` with what lies between the markers replaced by ``body``; heading and markers appended if absent.

    Raises:
        ValueError: only one of the markers is present, or they are out of order.
    """
    has_begin, has_end = begin in text, end in text
    if has_begin != has_end or (has_begin and text.index(begin) > text.index(end)):
        raise ValueError(f"docs markers {begin} / {end}: expected both, in that order")
    block = f"{begin}\n{body.strip()}\n{end}"
    if not has_begin:
        return text.rstrip("\n") + f"\n\n{heading}\n\n{block}\n"
    head, rest = text.split(begin, 1)
    tail = rest.split(end, 1)[1]
    return head + block + tail


def row_notes(row: Row, libs: Mapping[str, Sequence[Mapping[str, Any]]]) -> List[str]:
    """What a reader needs to know about a row: settings, zoo interpretation, mixed settings among records."""
    all_recs = [r for recs in libs.values() for r in recs]
    notes = [f"nervex config `{row.config}`; {row.sb3_source}"]
    for lib, recs in libs.items():
        budgets = sorted({r["budget"] for r in recs})
        notes.append(f"{LIB_NAMES[lib]} budget {', '.join(f'{b:,}' for b in budgets)} env steps")
        capped = [r for r in recs if time_capped(r)]
        if capped:
            steps = ", ".join(format(r["total_env_steps"], ",") for r in capped)
            notes.append(
                f"{LIB_NAMES[lib]} seeds {', '.join(str(r['seed']) for r in capped)} stopped by a training-time cap of "
                f"{capped[0]['max_train_secs']:g} s (`--peer-max-train-secs`) at "
                f"{steps} env steps without reaching the threshold"
            )
    sb3 = libs.get("sb3")
    if sb3:
        notes += sb3[-1]["config"].get("notes", [])
    for key in ("eval_freq", "n_eval", "threshold"):
        vals = sorted({r[key] for r in all_recs})
        if len(vals) > 1:
            notes.append(f"WARNING: records mix {key} = {vals}")
    if row.note:
        notes.append(row.note)
    freq = "/".join(str(v) for v in sorted({r["eval_freq"] for r in all_recs}))
    notes.append(f"evaluation every {freq} env steps on {_n_eval(libs)} greedy episodes")
    return notes


def wrap(text: str) -> str:
    """A paragraph hard-wrapped at 118 columns like the rest of docs/benchmarks.md (inline code kept whole)."""
    return textwrap.fill(text, width=118, break_long_words=False, break_on_hyphens=False)


def docs_body(
    rows: Sequence[Row], records: Mapping[str, Mapping[str, Sequence[Mapping[str, Any]]]], results_dir: str
) -> str:
    """The generated docs section: provenance, table, per-row notes and plots."""
    all_recs = [r for row in rows for recs in records[row.name].values() for r in recs]
    dates = sorted(r["date"][:10] for r in all_recs)
    machines = sorted({f"{r['machine']['platform']}, {r['machine']['cpu_count']} CPUs" for r in all_recs})
    versions = {k: v for r in all_recs for k, v in r["machine"]["versions"].items() if v}
    commands = sorted({r["command"] for r in all_recs})
    period = dates[0] if dates[0] == dates[-1] else f"{dates[0]} to {dates[-1]}"
    software = ", ".join(f"{k} {v}" for k, v in sorted(versions.items()))
    table = [table_line(row, {lib: summarize(recs) for lib, recs in records[row.name].items()}) for row in rows]
    where = os.path.relpath(results_dir, ROOT)
    paragraphs = [
        f"Generated by `bench/zoo.py` from the records in `{where}/` (re-render with `python bench/zoo.py --report`; "
        "do not edit by hand).",
        f"Runs {period}; machine: {'; '.join(machines)}; {software}. Commands:",
        "nervex trains its shipped config, SB3 rl-baselines3-zoo's hyperparameters for the env, read from the installed "
        "rl_zoo3 (`bench/zoo_sb3.py`), or, where the zoo has no entry for the env, SB3's defaults with the settings "
        "the row's notes list; interleaved seed by seed in one process, single-threaded. Steps and training "
        "seconds to the first greedy evaluation mean >= the threshold; evaluation and set-up time are not training "
        "time. Medians over seeds, a seed that did not reach the threshold counting as infinitely slow; ratios "
        "SB3 / nervex of the medians (> 1: nervex better; `>`/`<` bound the ratio when one side's median seed did not "
        "reach the threshold within its budget).",
    ]
    lines = [wrap(p) + "\n" for p in paragraphs]
    lines.insert(2, "\n".join(f"- `{c}`" for c in commands) + "\n")
    lines.append(render_table(table) + "\n")
    for row in rows:
        lines.append(wrap(f"**{row.name}**: " + "; ".join(row_notes(row, records[row.name])) + ".") + "\n")
        lines.append(f"![{row.env_id} {row.algo} learning curves](zoo_{row.name}.png)\n")
    return "\n".join(lines)


def report(results_dir: str, docs_file: Optional[str]) -> None:
    """Print the summary of every saved row; write the docs section and the PNGs unless ``docs_file`` is None."""
    records = load_records(results_dir)
    rows = [row for name, row in ROWS.items() if name in records]
    unknown = sorted(set(records) - set(ROWS))
    if unknown:
        print(f"ignoring saved records of rows no longer in the table: {', '.join(unknown)}")
    if not rows:
        print(f"no saved records under {results_dir}")
        return
    for row in rows:
        print_row_summary(row, records[row.name])
    if docs_file is None:
        return
    for row in rows:
        png = os.path.join(os.path.dirname(docs_file), f"zoo_{row.name}.png")
        plot_row(row, records[row.name], png)
        print(f"wrote {os.path.relpath(png, ROOT)}")
    with open(docs_file, encoding="utf-8") as f:
        text = f.read()
    with open(docs_file, "w", encoding="utf-8") as f:
        f.write(replace_marked_section(text, docs_body(rows, records, results_dir)))
    print(f"wrote the zoo section of {os.path.relpath(docs_file, ROOT)}")


def print_row_summary(row: Row, libs: Mapping[str, Sequence[Mapping[str, Any]]]) -> None:
    print(f"\n{row.name} ({row.env_id} {row.algo}, threshold {row.threshold:g})")
    for lib in LIBS:
        for r in libs.get(lib, []):
            print(f"  {LIB_NAMES[lib]:6s} seed {r['seed']}: {record_line(r)}")
    sums = {lib: summarize(recs) for lib, recs in libs.items()}
    for lib in LIBS:
        if lib in sums:
            s = sums[lib]
            print(
                f"  {LIB_NAMES[lib]:6s} median: {fmt_median(s.median_steps, 'steps')} steps, "
                f"{fmt_median(s.median_secs, 's')} s training ({s.n_reached}/{s.n_seeds} seeds reached)"
            )
    if len(sums) == 2:
        steps, secs = summary_ratios(sums["nervex"], sums["sb3"])
        print(f"  SB3 / nervex (> 1: nervex better): steps {steps}, training seconds {secs}")


# ---- throughput ------------------------------------------------------------------------------------------------------
NERVEX_KEYS = (
    "collector_env_num",
    "n_sample",
    "rollout_len",
    "batch_size",
    "train_iteration",
    "update_per_collect",
    "epoch_per_collect",
    "n_epoch",
    "learning_rate",
    "lr_schedule",
    "discount_factor",
    "gae_lambda",
    "clip_ratio",
    "clip_schedule",
    "entropy_weight",
    "value_weight",
    "grad_clip",
    "hidden_sizes",
    "target_update_freq",
    "learning_starts",
)


def find_keys(cfg: Any, names: Sequence[str], prefix: str = "") -> Dict[str, Any]:
    """Every ``dotted.path: value`` in a nested config whose last key is one of ``names``."""
    found: Dict[str, Any] = {}
    if isinstance(cfg, Mapping):
        for key, value in cfg.items():
            path = f"{prefix}{key}"
            if key in names and not isinstance(value, Mapping):
                found[path] = value
            found.update(find_keys(value, names, path + "."))
    return found


def throughput_nervex(row: Row, seed: int, steps: int) -> Tuple[float, Dict[str, Any]]:
    """Env steps per second of nervex's training loop with evaluation off, over the first ``steps`` env steps.

    ``max_env_step`` stays the config's (schedules tied to it run as shipped, like SB3's tied to the zoo's
    n_timesteps) unless ``steps`` is more; the loop stops at the first iteration that reaches ``steps``.
    """
    from nervex.config import read_config
    from nervex.entry import SerialTrainer

    shipped = int(float(read_config(os.path.join(ROOT, row.config)).get("max_env_step") or 0))
    cfg, _ = nervex_config(row, max(shipped, steps), NO_EVAL_FREQ, 1, 1.0e18)
    if row.throughput_overrides:
        from nervex.config import apply_overrides

        cfg = apply_overrides(cfg, list(row.throughput_overrides))
    with tempfile.TemporaryDirectory() as run_root:
        with SerialTrainer(cfg, seed=seed, exp_name=f"zoo_tp_{row.name}", run_root=run_root) as trainer:
            trainer.logger.setLevel("WARNING")
            start = time.perf_counter()
            for _ in trainer:
                if trainer.env_step >= steps:
                    break
            secs = time.perf_counter() - start
            return trainer.env_step / secs, find_keys(trainer.cfg, NERVEX_KEYS)


def throughput(row: Row, steps: int, repeats: int, libs: Sequence[str]) -> None:
    """Interleaved repeats of both libraries' training speed; median env steps/s and the ratio nervex/SB3."""
    from zoo_sb3 import throughput_sb3

    setup = row.sb3_setup(steps)
    rates: Dict[str, List[float]] = {lib: [] for lib in libs}
    keys: Dict[str, Dict[str, Any]] = {}
    for rep in range(repeats):
        for lib in libs:
            if lib == "nervex":
                rate, keys[lib] = throughput_nervex(row, rep, steps)
            else:
                rate, keys[lib] = throughput_sb3(setup, row.env_id, rep, steps)
            rates[lib].append(rate)
            print(f"  repeat {rep}: {LIB_NAMES[lib]:6s} {rate:,.0f} env steps/s", flush=True)
    print(f"\n{row.name} throughput, {steps:,} env steps of training, no evaluation, {repeats} repeats:")
    for lib in libs:
        print(f"  {LIB_NAMES[lib]:6s} median {statistics.median(rates[lib]):,.0f} env steps/s")
    if len(libs) == 2:
        print(f"  nervex / SB3: {statistics.median(rates['nervex']) / statistics.median(rates['sb3']):.2f}x")
    print("\nkey hyperparameters (check they match for a like-for-like figure):")
    for lib in libs:
        print(f"  {LIB_NAMES[lib]} ({row.config if lib == 'nervex' else row.sb3_source.replace('`', '')}):")
        for k, v in keys[lib].items():
            print(f"    {k}: {v}")
    if row.throughput_overrides:
        print(f"\nnervex ran with {', '.join(row.throughput_overrides)} (the zoo's values) over its shipped config")
    if row.name == "cartpole_ppo":
        print(
            "\nnote: this compares like with like only if nervex's shipped cartpole_ppo.yaml uses the zoo's "
            "hyperparameters: n_envs = collector_env_num, n_steps x n_envs = env steps per collect, batch_size, "
            "n_epochs, learning_rate (SB3's values above, from the zoo)."
        )


# ---- command line ----------------------------------------------------------------------------------------------------
def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", nargs="+", choices=list(ROWS), default=list(ROWS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--only", choices=LIBS, default=None, help="run one library")
    parser.add_argument("--until", choices=("threshold", "budget"), default="threshold")
    parser.add_argument("--eval-freq", type=int, default=None, help="env steps between evaluations (default: row's)")
    parser.add_argument("--n-eval", type=int, default=10, help="greedy episodes per evaluation")
    parser.add_argument(
        "--peer-max-train-secs",
        type=float,
        default=None,
        help="stop an SB3 seed after this much training time (a peer too slow for its full budget here); the table "
        "then bounds the seconds ratio by the cap and leaves the steps ratio unknown",
    )
    parser.add_argument("--report", action="store_true", help="render table and PNGs from saved results only")
    parser.add_argument("--no-docs", action="store_true", help="print, but write neither docs nor PNGs")
    parser.add_argument("--results-dir", default=RESULTS_DIR)
    parser.add_argument("--docs-file", default=DOCS_FILE, help="markdown file of the zoo section; PNGs go next to it")
    parser.add_argument("--throughput", metavar="ROW", choices=list(ROWS), default=None)
    parser.add_argument("--steps", type=int, default=20_000, help="env steps per throughput repeat")
    parser.add_argument("--repeats", type=int, default=3, help="throughput repeats")
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    import torch

    torch.set_num_threads(1)
    libs = [args.only] if args.only else list(LIBS)
    docs = None if args.no_docs else args.docs_file
    start = time.perf_counter()
    if args.throughput:
        throughput(ROWS[args.throughput], args.steps, args.repeats, libs)
        return 0
    ok = True
    if not args.report:
        opts = RunOptions(args.eval_freq, args.n_eval, args.until, args.results_dir, args.peer_max_train_secs)
        ok = run_rows([ROWS[name] for name in args.rows], args.seeds, libs, opts)
    report(args.results_dir, docs)
    print(f"\ntotal wall time {time.perf_counter() - start:.1f}s", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
