"""The league benchmark: exact exploitability of what nervex's league reports, against open_spiel's own NFSP.

Parts (records in ``bench/results/league/``, the table and curves rendered by ``--report``):

- ``matrix``: rock-paper-scissors and DI-engine's 2x2 zero-sum game played by networks
  (``app_zoo/games/matrix/config/*_league.yaml``): env steps and training seconds until exploitability < 0.02.
- ``kuhn``: Kuhn poker, nervex's league (``kuhn_league.yaml``) and open_spiel's PyTorch NFSP with its example
  settings (``bench/league_nfsp.py``), interleaved per seed, the same training-time budget: when each first goes
  below 0.05, and the curves against training seconds and against episodes (games).
- ``leduc``: the same for Leduc poker at a fixed budget (no target).
- ``modes``: uniform self-play, PFSP, the full league (a main player, a main exploiter and a league exploiter) and
  PSRO's Nash matchmaking on the same game and env-step budget: every report (the history's Nash mixture, its
  uniform mixture, the current main player).

nervex's exploitability is of the main player's history mixed as PSRO reports it (each seat's Nash mixture of the
history's meta-game, ``league/exploitability``); ``fp`` is the uniform mixture (fictitious play's report) and
``main`` the current main player alone. Training seconds exclude evaluation on both sides.

    python bench/league.py --part matrix --seeds 0 1 2
    python bench/league.py --part kuhn --seeds 0 1 2 --seconds 300
    python bench/league.py --part leduc --seeds 0 --seconds 600
    python bench/league.py --part modes --seeds 0 1 2
    python bench/league.py --report
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse
import datetime
import json
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH_DIR)
sys.path[:0] = [BENCH_DIR, ROOT]

RESULTS_DIR = os.path.join(ROOT, "bench", "results", "league")
CONFIGS = {
    "rps": "app_zoo/games/matrix/config/rps_league.yaml",
    "zero_sum_2x2": "app_zoo/games/matrix/config/zero_sum_2x2_league.yaml",
    "kuhn_poker": "app_zoo/games/poker/config/kuhn_league.yaml",
    "leduc_poker": "app_zoo/games/poker/config/leduc_league.yaml",
}
TARGETS = {"rps": 0.02, "zero_sum_2x2": 0.02, "kuhn_poker": 0.05}
MODES: Dict[str, List[str]] = {
    "self_play": ["league.matchmaking=self_play"],
    "uniform": ["league.matchmaking=uniform"],
    "pfsp": ["league.matchmaking=pfsp"],
    "league": [
        "league.matchmaking=alphastar",
        "league.players=[{name: main, kind: main}, {name: main_exploiter, kind: main_exploiter}, "
        "{name: league_exploiter, kind: league_exploiter}]",
    ],
    "nash": ["league.matchmaking=nash"],
}


def nervex_league(
    game: str,
    seed: int,
    *,
    seconds: Optional[float] = None,
    steps: Optional[int] = None,
    eval_every: int,
    overrides: Sequence[str] = (),
    stop_below: Optional[float] = None,
) -> Dict[str, Any]:
    """Train the shipped league config of ``game`` until ``seconds`` of training or ``steps`` env steps (or the
    exploitability is below ``stop_below``), evaluating every ``eval_every`` env steps outside the clock."""
    from nervex.config import apply_overrides, read_config
    from nervex.entry.league_entry import LeagueTrainer

    if seconds is None and steps is None:
        raise ValueError("nervex_league: give seconds or steps (a budget)")
    cfg = read_config(os.path.join(ROOT, CONFIGS[game]))
    over = [
        f"max_env_step={steps or 10**12}",
        "league.eval.freq=1000000000000",  # evaluations are driven here, off the clock
        "league.eval.stop_exploitability=null",
        "evaluator.eval_freq=1000000000000",
        *overrides,
    ]
    cfg = apply_overrides(cfg, over)
    curve: List[Dict[str, float]] = []
    train_secs = 0.0
    with tempfile.TemporaryDirectory() as run_root:
        trainer = LeagueTrainer(cfg, seed=seed, exp_name="league", run_root=run_root)
        try:

            def point() -> Dict[str, float]:
                figures = trainer.evaluate()
                episodes = sum(a.episode_count for p in trainer.players.values() for a in p.actors)
                curve.append(
                    dict(
                        env_steps=trainer.env_step,
                        episodes=episodes,
                        wall_secs=train_secs,
                        exploitability=figures.get("league/exploitability", float("nan")),
                        fp=figures.get("league/exploitability_fp", float("nan")),
                        main=figures.get("league/exploitability_main", float("nan")),
                        history=figures.get("league/history", 0.0),
                    )
                )
                return curve[-1]

            point()
            last = 0
            while (seconds is None or train_secs < seconds) and (steps is None or trainer.env_step < steps):
                start = time.perf_counter()
                trainer.train()
                train_secs += time.perf_counter() - start
                if trainer.env_step - last >= eval_every:
                    last = trainer.env_step
                    if point()["exploitability"] < (stop_below if stop_below is not None else -1.0):
                        break
            if curve[-1]["env_steps"] != trainer.env_step:
                point()
        finally:
            trainer.close()
    return dict(curve=curve, train_secs=train_secs, env_steps=curve[-1]["env_steps"], overrides=list(overrides))


def first_below(curve: Sequence[Dict[str, float]], threshold: float) -> Optional[Dict[str, float]]:
    for p in curve:
        if p["exploitability"] < threshold:
            return {k: p[k] for k in ("env_steps", "episodes", "wall_secs") if k in p}
    return None


def save(record: Dict[str, Any], out: str, name: str) -> str:
    from league_nfsp import machine
    from marl import command_line

    record = dict(record, date=datetime.date.today().isoformat(), machine=machine())
    record["command"] = command_line().replace("bench/marl.py", "bench/league.py", 1)
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, f"{name}.json")
    with open(path, "w") as f:
        json.dump(record, f, indent=1)
    return path


def run_part(args: argparse.Namespace) -> None:
    from league_nfsp import run_nfsp

    for seed in args.seeds:
        if args.part == "matrix":
            for game in ("rps", "zero_sum_2x2"):
                out = nervex_league(game, seed, steps=args.steps or 20000, eval_every=200, stop_below=TARGETS[game])
                out.update(game=game, lib="nervex", seed=seed, first_below=first_below(out["curve"], TARGETS[game]))
                print(f"{game} seed {seed}: {out['first_below']}")
                save(out, args.out, f"{game}__nervex__seed{seed}")
        elif args.part in ("kuhn", "leduc"):
            game = f"{args.part}_poker"
            seconds = args.seconds or (300.0 if game == "kuhn_poker" else 600.0)
            every = 5000 if game == "kuhn_poker" else 50000
            runs = []
            if "nervex" in args.libs:
                ours = nervex_league(game, seed, seconds=seconds, eval_every=every)
                runs.append((dict(ours, game=game, lib="nervex", seed=seed), "nervex"))
            if "nfsp" in args.libs:
                nfsp = run_nfsp(game, seed, seconds=seconds, episodes=None, eval_every=None, eval_seconds=seconds / 20)
                runs.append((dict(nfsp, game=game, lib="open_spiel_nfsp", seed=seed), "open_spiel_nfsp"))
            for rec, lib in runs:
                if game in TARGETS:
                    rec["first_below"] = first_below(rec["curve"], TARGETS[game])
                print(
                    f"{game} {lib} seed {seed}: final {rec['curve'][-1]['exploitability']:.4f} {rec.get('first_below')}"
                )
                save(rec, args.out, f"{game}__{lib}__seed{seed}")
        elif args.part == "modes":
            for game, steps in (("rps", 20000), ("kuhn_poker", 100000)):
                for mode, over in MODES.items():
                    out = nervex_league(game, seed, steps=args.steps or steps, eval_every=steps // 10, overrides=over)
                    out.update(game=game, lib="nervex", mode=mode, seed=seed)
                    last = out["curve"][-1]
                    print(
                        f"{game} {mode} seed {seed}: nash {last['exploitability']:.4f} fp {last['fp']:.4f} main {last['main']:.4f}"
                    )
                    save(out, args.out, f"modes__{game}__{mode}__seed{seed}")


# ---- the report --------------------------------------------------------------------------------------------------
def load_records(directory: str = RESULTS_DIR) -> List[Dict[str, Any]]:
    records = []
    for name in sorted(os.listdir(directory)) if os.path.isdir(directory) else []:
        if name.endswith(".json"):
            with open(os.path.join(directory, name)) as f:
                records.append(json.load(f))
    return records


def report(records: List[Dict[str, Any]], plot: bool = True) -> str:
    """The Markdown tables of the records (and, with ``plot``, the curves as PNGs under docs/)."""
    lines: List[str] = []
    matrix = [r for r in records if r.get("game") in ("rps", "zero_sum_2x2") and "mode" not in r]
    if matrix:
        lines += ["| game | seed | env steps to < 0.02 | training s | snapshots |", "|---|---|---|---|---|"]
        for r in matrix:
            fb = r.get("first_below") or {}
            hist = next((p["history"] for p in r["curve"] if p["env_steps"] == fb.get("env_steps")), "")
            lines.append(
                f"| {r['game']} | {r['seed']} | {fb.get('env_steps', 'not reached')} | "
                f"{fb.get('wall_secs', float('nan')):.1f} | {hist:.0f} |"
            )
        lines.append("")
    for game in ("kuhn_poker", "leduc_poker"):
        rows = [r for r in records if r.get("game") == game and "mode" not in r]
        if not rows:
            continue
        lines += [
            f"| {game} | seed | training s | episodes | final exploitability | first < 0.05 (s / episodes) |",
            "|---|---|---|---|---|---|",
        ]
        for r in sorted(rows, key=lambda r: (r["seed"], r["lib"])):
            last = r["curve"][-1]
            fb = first_below(r["curve"], 0.05)
            when = f"{fb['wall_secs']:.1f} / {fb['episodes']:,}" if fb else "not reached"
            lines.append(
                f"| {r['lib']} | {r['seed']} | {last['wall_secs']:.0f} | {last['episodes']:,} | "
                f"{last['exploitability']:.4f} | {when} |"
            )
        lines.append("")
        if plot:
            plot_curves(rows, game)
    modes = [r for r in records if "mode" in r]
    if modes:
        lines += [
            "| game | matchmaking | seeds | Nash mixture | uniform mixture (FP) | current main player |",
            "|---|---|---|---|---|---|",
        ]
        for game in sorted({r["game"] for r in modes}):
            for mode in MODES:
                rows = [r["curve"][-1] for r in modes if r["game"] == game and r["mode"] == mode]
                if rows:
                    mean = {k: np.mean([p[k] for p in rows]) for k in ("exploitability", "fp", "main")}
                    lines.append(
                        f"| {game} | {mode} | {len(rows)} | {mean['exploitability']:.4f} | {mean['fp']:.4f} | "
                        f"{mean['main']:.4f} |"
                    )
        lines.append("")
    return "\n".join(lines)


def plot_curves(rows: List[Dict[str, Any]], game: str) -> None:
    """``docs/league_<game>.png``: exploitability against training seconds and against episodes, each run a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    colors = {"nervex": "tab:blue", "open_spiel_nfsp": "tab:orange"}
    for r in rows:
        xs = [p["wall_secs"] for p in r["curve"]], [p["episodes"] for p in r["curve"]]
        ys = [p["exploitability"] for p in r["curve"]]
        for ax, x in zip(axes, xs):
            ax.plot(x, ys, color=colors.get(r["lib"], "gray"), alpha=0.8, label=f"{r['lib']} seed {r['seed']}")
            if "fp" in r["curve"][-1]:  # nervex's history as fictitious play reports it (the uniform mixture)
                fp = [p["fp"] for p in r["curve"]]
                label = "nervex, uniform mixture (FP)" if r["seed"] == min(q["seed"] for q in rows) else None
                ax.plot(x, fp, color="tab:green", alpha=0.5, ls="--", label=label)
    for ax, label in zip(axes, ("training seconds", "episodes (games)")):
        ax.set_xlabel(label)
        ax.set_ylabel("exploitability")
        ax.set_yscale("symlog", linthresh=0.01)
        ax.grid(alpha=0.3)
    if game in TARGETS:
        for ax in axes:
            ax.axhline(TARGETS[game], color="k", ls="--", lw=0.8)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"{game}: nervex league (PSRO report; dashed: FP report) vs open_spiel NFSP (average policy)")
    fig.tight_layout()
    fig.savefig(os.path.join(ROOT, "docs", f"league_{game}.png"), dpi=90)
    plt.close(fig)


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--part", choices=["matrix", "kuhn", "leduc", "modes"])
    p.add_argument("--seeds", nargs="+", type=int, default=[0])
    p.add_argument("--seconds", type=float, help="training seconds per run (kuhn, leduc)")
    p.add_argument("--steps", type=int, help="env steps per run (matrix, modes)")
    p.add_argument("--libs", nargs="+", choices=["nervex", "nfsp"], default=["nervex", "nfsp"], help="kuhn, leduc")
    p.add_argument("--out", default=RESULTS_DIR)
    p.add_argument("--report", action="store_true", help="print the tables and draw the curves; run nothing")
    args = p.parse_args(argv)
    if args.report:
        print(report(load_records(args.out)))
        return 0
    if args.part is None:
        p.error("give --part or --report")
    run_part(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
