"""Start the coordinator of a parallel run: ``python -m nervex.system.coordinator_start --config x.yaml``.

It writes ``<run_dir>/coordinator.url`` once it listens (how ``run.sh dist`` and the other roles find it), creates the
run token (``<run_dir>/run_token``, unless ``$NERVEX_RUN_TOKEN`` is set), logs to ``<run_dir>/logs/coordinator.log``
and stops cleanly on SIGTERM or SIGINT. Exit status: 0 after a clean stop, 2 for a bad config or a run directory
another coordinator holds.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from typing import Any, List, Optional

LOG_FILE = os.path.join("logs", "coordinator.log")


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``python -m nervex.system.coordinator_start``."""
    parser = argparse.ArgumentParser(
        prog="python -m nervex.system.coordinator_start",
        description="Run the coordinator of a parallel nervex run (task table, leases, back-pressure) until "
        "SIGTERM or SIGINT.",
    )
    parser.add_argument("-c", "--config", required=True, help="the run's YAML config (the same file for every role)")
    parser.add_argument(
        "--run-dir",
        default=None,
        help="run directory on node-local disk (default: runs/<exp_name>, else runs/<env>__<policy>__<seed>__<hash>)",
    )
    parser.add_argument("--host", default=None, help="bind address (default: system.coordinator.host, 127.0.0.1)")
    parser.add_argument("--port", type=int, default=None, help="port (default: system.coordinator.port; 0: a free one)")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="dotted config override, e.g. system.coordinator.lease_s=10 (every role needs the same ones)",
    )
    return parser


def build_logger(run_dir: str) -> logging.Logger:
    """The coordinator's logger: ``<run_dir>/logs/coordinator.log`` and stderr."""
    logger = logging.getLogger("nervex.system.coordinator")
    logger.setLevel(logging.INFO)
    logger.propagate = False
    os.makedirs(os.path.join(run_dir, "logs"), exist_ok=True)
    fmt = logging.Formatter("[%(asctime)s] %(levelname)s %(message)s")
    for handler in (logging.FileHandler(os.path.join(run_dir, LOG_FILE), encoding="utf-8"), logging.StreamHandler()):
        handler.setFormatter(fmt)
        logger.addHandler(handler)
    return logger


def main(argv: Optional[List[str]] = None) -> int:
    """Run the coordinator until SIGTERM or SIGINT; returns the exit status."""
    args = build_parser().parse_args(argv)
    # Imported after parsing, so --help answers without importing torch.
    from nervex.config import ConfigError, apply_overrides, read_config
    from nervex.system.coordinator import Coordinator, CoordinatorError
    from nervex.system.protocol import compile_parallel_config, default_run_dir
    from nervex.system.task_table import TaskTableError

    try:
        cfg = compile_parallel_config(apply_overrides(read_config(args.config), args.overrides))
    except (ConfigError, FileNotFoundError) as error:
        print(f"coordinator_start: {error}", file=sys.stderr)
        return 2
    run_dir = args.run_dir or default_run_dir(cfg)
    logger = build_logger(run_dir)
    coordinator = Coordinator(cfg, run_dir, host=args.host, port=args.port, logger=logger)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda number, frame: _request_stop(stop, logger, number))
    try:
        coordinator.start()
    except (TaskTableError, CoordinatorError, OSError) as error:
        logger.error("coordinator_start: %s", error)
        return 2
    try:
        while not stop.wait(0.5):
            pass
    finally:
        coordinator.stop()
        logger.info("coordinator stopped")
    return 0


def _request_stop(stop: threading.Event, logger: logging.Logger, signum: Any) -> None:
    logger.info("received %s; stopping", signal.Signals(signum).name)
    stop.set()


if __name__ == "__main__":
    sys.exit(main())
