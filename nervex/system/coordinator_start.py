"""Start the coordinator of a parallel run: ``python -m nervex.system.coordinator_start --config x.yaml``.

It writes ``<run_dir>/coordinator.url`` once it listens (how ``run.sh dist`` and the other roles find it), creates the
run token (``<run_dir>/run_token``, unless ``$NERVEX_RUN_TOKEN`` is set), logs to ``<run_dir>/logs/coordinator.log``
and stops cleanly on SIGTERM or SIGINT. Exit status: 0 after a clean stop, 2 for a bad config or a run directory
another coordinator holds.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import List, Optional

from nervex.system.cli import build_parser as build_role_parser
from nervex.system.cli import load_config


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``python -m nervex.system.coordinator_start``: the shared options plus the address."""
    parser = build_role_parser(
        "coordinator",
        "Run the coordinator of a parallel nervex run (task table, leases, back-pressure) until SIGTERM or SIGINT.",
    )
    parser.add_argument("--host", default=None, help="bind address (default: system.coordinator.host, 127.0.0.1)")
    parser.add_argument("--port", type=int, default=None, help="port (default: system.coordinator.port; 0: a free one)")
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    """Run the coordinator until SIGTERM or SIGINT; returns the exit status."""
    args = build_parser().parse_args(argv)
    loaded = load_config("coordinator_start", args)  # imports torch only after --help had its chance
    if loaded is None:
        return 2
    cfg, run_dir = loaded
    from nervex.system.coordinator import Coordinator, CoordinatorError, TaskTableError
    from nervex.system.role import StopFlag, close_role_logger, role_logger

    logger = role_logger(run_dir, "coordinator")
    stop = StopFlag()
    coordinator = Coordinator(cfg, run_dir, host=args.host, port=args.port, logger=logger)
    try:
        try:
            coordinator.start()
        except (TaskTableError, CoordinatorError, OSError) as error:
            logger.error("coordinator_start: %s", error)
            return 2
        try:
            while not stop.is_set():
                time.sleep(0.2)
            logger.info("received %s; stopping", stop.signal_name or "a stop request")
        finally:
            coordinator.stop()
            logger.info("coordinator stopped")
        return 0
    finally:
        stop.restore()
        close_role_logger(logger)


if __name__ == "__main__":
    sys.exit(main())
