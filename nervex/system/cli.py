"""The command line every ``python -m nervex.system.<role>_start`` shares: config, run directory, overrides, address.

Each role's module parses with ``build_parser`` and loads with ``load_config``; torch and the policies are imported
only after parsing, so ``--help`` answers at once. Exit statuses: 0 after a clean stop, 1 on an unexpected error,
2 for bad input (a config error, a refused registration, a run directory held by another coordinator).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Callable, List, Optional, Tuple


def build_parser(role: str, description: str) -> argparse.ArgumentParser:
    """The shared options: ``-c/--config``, ``--run-dir``, ``--set KEY=VALUE`` (repeatable), ``--url``."""
    parser = argparse.ArgumentParser(prog=f"python -m nervex.system.{role}_start", description=description)
    parser.add_argument("-c", "--config", required=True, help="the run's YAML config (the same file for every role)")
    parser.add_argument(
        "--run-dir",
        default=None,
        help="run directory shared by the roles (default: runs/<exp_name>, else runs/<env>__<policy>__<seed>__<hash>)",
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="dotted config override, e.g. system.coordinator.lease_s=10 (every role needs the same ones)",
    )
    if role != "coordinator":
        parser.add_argument(
            "--url",
            default=None,
            help="address to talk to (default: the one in <run_dir>/coordinator.url; a manager gives its children its "
            "relay address)",
        )
        parser.add_argument(
            "--worker-id",
            default=None,
            help="id at the coordinator (default: <role>-<host>-<pid>; the learner: learner-<rank>)",
        )
    return parser


def load_config(prog: str, args: argparse.Namespace) -> Optional[Tuple[Any, str]]:
    """``(compiled config, run_dir)``, or None after printing the config error to stderr (exit with 2)."""
    from nervex.config import ConfigError, apply_overrides, read_config
    from nervex.entry.builder import compile_parallel_config
    from nervex.system.system_config import default_run_dir

    try:
        cfg = compile_parallel_config(apply_overrides(read_config(args.config), args.overrides))
    except (ConfigError, FileNotFoundError) as error:
        print(f"{prog}: {error}", file=sys.stderr)
        return None
    return cfg, args.run_dir or default_run_dir(cfg)


def forward_args(args: argparse.Namespace) -> List[str]:
    """The shared options as a command line again (a manager starting its children)."""
    out = ["--config", args.config]
    if args.run_dir:
        out += ["--run-dir", args.run_dir]
    for item in args.overrides:
        out += ["--set", item]
    return out


def run_role(run_dir: str, log_name: str, run: Callable[[Any, Any], None], stop: Optional[Any] = None) -> int:
    """Run one role with the exit protocol every ``*_start`` shares; returns the exit status.

    Args:
        run_dir: The run directory (the log is ``<run_dir>/logs/<log_name>.log``).
        log_name: The role's log name (``actor-3``, ``learner-0``...).
        run: ``run(logger, stop)`` builds the role and runs it to its end (closing it on the way out).
        stop: Signal flags with ``restore()`` (``StopSignals`` for the learner); a ``StopFlag`` (SIGTERM, SIGINT) if None.

    Returns:
        0 after a clean stop, the ``RoleExit`` code (2: refused at registration), 1 on any other error (logged).
    """
    from nervex.system.role import RoleExit, StopFlag, close_role_logger, role_logger

    logger = role_logger(run_dir, log_name)
    stop = stop if stop is not None else StopFlag()
    try:
        run(logger, stop)
    except RoleExit as error:
        logger.error("%s", error)
        return error.code
    except Exception:
        logger.exception("%s failed", log_name)
        return 1
    finally:
        stop.restore()
        close_role_logger(logger)
    return 0


__all__ = ["build_parser", "forward_args", "load_config", "run_role"]
