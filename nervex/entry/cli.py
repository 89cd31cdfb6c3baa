"""The ``nervex`` command line.

- ``nervex -m serial -c CONFIG -s SEED [--set key.path=value ...]``: train.
- ``nervex -m eval --ckpt PATH [--episodes N] [--video DIR] [--deterministic|--stochastic]``: evaluate, record.
- ``nervex -m tune -c CONFIG --space SPACE.yaml --trials N [--storage URL] [--seeds K]``: search hyperparameters.
- ``nervex plot RUN_DIR... [--out curves.png]``: learning curves from ``eval.csv`` (its own arguments).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, List, Optional

DEFAULT_CONFIG = "app_zoo/classic_control/cartpole/config/cartpole_dqn.yaml"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="nervex",
        description="Train a registered RL policy on an environment from one YAML config.",
        epilog="example: nervex -m serial -c app_zoo/classic_control/cartpole/config/cartpole_dqn.yaml -s 0 "
        "--set policy.learn.batch_size=128",
    )
    parser.add_argument(
        "-m",
        "--mode",
        default="serial",
        choices=["serial", "eval", "tune"],
        help="serial: train (default); eval: evaluate --ckpt with an eval-only policy; tune: search --space",
    )
    parser.add_argument("-c", "--config", default=DEFAULT_CONFIG, help=f"YAML config (default: {DEFAULT_CONFIG})")
    parser.add_argument("-s", "--seed", type=int, default=None, help="random seed (default: the config's seed)")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY.PATH=VALUE",
        help="override a config value, e.g. --set policy.learn.batch_size=64 (repeatable)",
    )
    parser.add_argument("--exp-name", default=None, help="run directory name under --run-root")
    parser.add_argument("--run-root", default="runs", help="parent folder of run directories (default: runs)")
    parser.add_argument("--no-progress", action="store_true", help="never show the progress bar")
    parser.add_argument(
        "--ckpt", default=None, help="(eval) checkpoint to evaluate; -c defaults to its run's config.yaml"
    )
    parser.add_argument("--episodes", type=int, default=None, help="(eval) episodes (default: evaluator.n_episode)")
    parser.add_argument("--video", default=None, metavar="DIR", help="(eval) record the episodes to mp4 files in DIR")
    greedy = parser.add_mutually_exclusive_group()
    greedy.add_argument(
        "--deterministic", dest="deterministic", action="store_true", default=True, help="(eval) greedy (default)"
    )
    greedy.add_argument(
        "--stochastic",
        dest="deterministic",
        action="store_false",
        help="(eval) act as the collect mode does at the checkpoint's env_step (sampled actions; DQN: its epsilon)",
    )
    parser.add_argument("--space", default=None, help="(tune) YAML of the dotted keys to search and their ranges")
    parser.add_argument("--trials", type=int, default=None, help="(tune) trials in the study (counting resumed ones)")
    parser.add_argument("--storage", default=None, help="(tune) Optuna storage, e.g. sqlite:///tune.db (resumable)")
    parser.add_argument("--seeds", type=int, default=None, help="(tune) seeds averaged per trial (default 3)")
    parser.add_argument("--study-name", default=None, help="(tune) study name (default: the config's file name)")
    parser.add_argument(
        "--objective",
        default=None,
        choices=["auc", "last"],
        help="(tune) score per seed, capped at stop_val: auc, the area under the eval curve (default; rewards "
        "speed), or last, the last evaluation (rl-zoo's)",
    )
    parser.add_argument(
        "--startup-trials", type=int, default=None, help="(tune) random trials before TPE, and before pruning (5)"
    )
    parser.add_argument(
        "--warmup-evals", type=int, default=None, help="(tune) evaluation rounds before a trial may be pruned"
    )
    return parser


def _eval(args: argparse.Namespace) -> int:
    """``-m eval``: the evaluator's figures of ``--ckpt``; with ``--video DIR`` or ``--stochastic``, the episodes are
    played in this process on one env (``nervex.tools.watch``), and ``--video`` records each to an mp4 file."""
    from nervex.config import ConfigError, apply_overrides, read_config
    from nervex.entry.builder import compile_config
    from nervex.entry.serial_entry import run_config_of, serial_eval
    from nervex.torch_utils import CheckpointError

    if not args.ckpt:
        print("nervex: error: -m eval needs --ckpt PATH", file=sys.stderr)
        return 2
    config = args.config if args.config != DEFAULT_CONFIG else run_config_of(args.ckpt)
    played_here = args.video is not None or not args.deterministic
    try:
        cfg = read_config(config)
        if args.overrides:
            cfg = apply_overrides(cfg, args.overrides)
        cfg = compile_config(cfg)
        if played_here:
            from nervex.tools.watch import watch

            result = watch(
                args.ckpt,
                cfg,
                episodes=args.episodes,
                video_dir=args.video,
                deterministic=args.deterministic,
                seed=args.seed or 0,
            )
        else:
            result = serial_eval(args.ckpt, cfg, seed=args.seed or 0, n_episode=args.episodes)
    except (ConfigError, FileNotFoundError, CheckpointError, ValueError, KeyError, ImportError) as e:
        # ValueError covers an env that cannot render (CannotRenderError), ImportError a missing extra
        message = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"nervex: error: {message}", file=sys.stderr)
        return 2
    _print_eval(result, played_here, args.deterministic)
    if args.video is not None:
        print(f"videos: {len(result['videos'])} mp4 file(s) in {os.path.abspath(args.video)}")
        if cfg.get("logger", {}).get("wandb", {}).get("mode", "disabled") != "disabled":
            from nervex.utils.wandb_logger import log_eval_videos

            try:
                log_eval_videos(cfg, result["videos"], args.ckpt, env_step=result["env_step"])
            except ImportError as e:  # W&B on in the config, wandb not installed: the videos are written anyway
                print(f"nervex: error: {e}", file=sys.stderr)
                return 2
    return 0


def _print_eval(result: dict, played_here: bool, deterministic: bool) -> None:
    """``-m eval``'s report: each episode played here, the returns' figures, then the env's own figures."""
    if played_here:
        from nervex.tools.watch import describe

        for line in describe(result):
            print(line)
    print(
        f"eval: mean_reward={result['eval/mean_reward']:.2f} std={result['eval/std_reward']:.2f} "
        f"min={result['eval/min_reward']:.2f} max={result['eval/max_reward']:.2f} episodes={result['eval/n_episode']}"
        + ("" if deterministic else " (stochastic)")
    )
    shown = {"eval/mean_reward", "eval/std_reward", "eval/min_reward", "eval/max_reward", "eval/n_episode"}
    figures = [  # the env's own episode figures (a scoring rate, a waiting time) and the team's returns
        f"{key[5:]}={value:.4g}"
        for key, value in result.items()
        if key.startswith("eval/") and key not in shown and isinstance(value, (int, float))
    ]
    if figures:
        print("eval figures: " + " ".join(figures))


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["plot"]:
        from nervex.tools.plot import main as plot_main

        return plot_main(argv[1:])
    args = build_parser().parse_args(argv)
    if args.mode == "eval":
        return _eval(args)
    if args.mode == "tune":
        from nervex.tools.tune import run_tune

        return run_tune(args)
    from nervex.config import ConfigError, apply_overrides, read_config
    from nervex.entry.builder import compile_config
    from nervex.torch_utils import CheckpointError

    try:
        cfg = read_config(args.config)
        if args.overrides:
            cfg = apply_overrides(cfg, args.overrides)
        cfg = compile_config(cfg)
    except (ConfigError, FileNotFoundError) as e:
        print(f"nervex: error: {e}", file=sys.stderr)
        return 2
    seed = args.seed if args.seed is not None else int(cfg.seed)
    if "league" in cfg:
        return _train_league(args, cfg, seed)
    from nervex.entry import SerialTrainer

    try:
        trainer = SerialTrainer(cfg, seed=seed, exp_name=args.exp_name, run_root=args.run_root)
    except (KeyError, ValueError, ImportError, CheckpointError, FileNotFoundError) as e:
        # building the envs, model or buffer from a valid-looking config can still fail on a value (an unknown
        # Gymnasium id, a missing extra): say what, without a traceback
        message = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"nervex: error: {message}", file=sys.stderr)
        return 2
    try:
        result = trainer.run(progress=False if args.no_progress else None)
    except KeyboardInterrupt:
        print("nervex: interrupted; saving the final checkpoint", file=sys.stderr)
        return 130
    finally:
        trainer.close()
    best = trainer.evaluator.best_reward
    print(
        f"done: {trainer.stop_reason}; env_step={result.get('env_step', trainer.env_step)} "
        f"train_iter={trainer.train_iter} best_eval={best:.2f} run_dir={trainer.run_dir}"
    )
    return 0


def _train_league(args: argparse.Namespace, cfg: Any, seed: int) -> int:
    """``nervex -m serial`` of a config with a ``league`` section: every learning player in this process."""
    from nervex.entry.league_entry import LeagueTrainer

    try:
        trainer = LeagueTrainer(cfg, seed=seed, exp_name=args.exp_name, run_root=args.run_root)
    except (KeyError, ValueError, ImportError, FileNotFoundError) as e:
        message = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"nervex: error: {message}", file=sys.stderr)
        return 2
    try:
        trainer.run(progress=False if args.no_progress else None)
    except KeyboardInterrupt:
        print("nervex: interrupted; saving the final checkpoints", file=sys.stderr)
        return 130
    finally:
        trainer.close()
    shown = " ".join(f"{k}={v:.4g}" for k, v in trainer.last_eval.items() if k.startswith("league/exploit"))
    print(f"done: {trainer.stop_reason}; env_step={trainer.env_step} {shown} run_dir={trainer.run_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
