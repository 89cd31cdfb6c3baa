"""The ``nervex`` command line: ``nervex -m serial -c CONFIG -s SEED [--set key.path=value ...]``."""

from __future__ import annotations

import argparse
import sys
from typing import List, Optional

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
        choices=["serial", "eval"],
        help="serial: train (default); eval: evaluate --ckpt with an eval-only policy",
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
    return parser


def _eval(args: argparse.Namespace) -> int:
    from nervex.config import ConfigError, apply_overrides, read_config
    from nervex.entry.builder import compile_config
    from nervex.entry.serial_entry import run_config_of, serial_eval
    from nervex.torch_utils import CheckpointError

    if not args.ckpt:
        print("nervex: error: -m eval needs --ckpt PATH", file=sys.stderr)
        return 2
    config = args.config if args.config != DEFAULT_CONFIG else run_config_of(args.ckpt)
    try:
        cfg = read_config(config)
        if args.overrides:
            cfg = apply_overrides(cfg, args.overrides)
        cfg = compile_config(cfg)
        result = serial_eval(args.ckpt, cfg, seed=args.seed or 0, n_episode=args.episodes)
    except (ConfigError, FileNotFoundError, CheckpointError, ValueError, KeyError) as e:
        message = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"nervex: error: {message}", file=sys.stderr)
        return 2
    print(
        f"eval: mean_reward={result['eval/mean_reward']:.2f} std={result['eval/std_reward']:.2f} "
        f"min={result['eval/min_reward']:.2f} max={result['eval/max_reward']:.2f} episodes={result['eval/n_episode']}"
    )
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    if args.mode == "eval":
        return _eval(args)
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
    from nervex.entry import SerialTrainer

    seed = args.seed if args.seed is not None else int(cfg.seed)
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


if __name__ == "__main__":
    sys.exit(main())
