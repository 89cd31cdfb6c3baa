"""Start the coordinator of a parallel run: ``python -m nervex.system.coordinator_start --config x.yaml``.

It writes ``<run_dir>/coordinator.url`` once it listens (how ``run.sh dist`` and the other roles find it), creates the
run token (``<run_dir>/run_token``, unless ``$NERVEX_RUN_TOKEN`` is set), logs to ``<run_dir>/logs/coordinator.log``
and stops cleanly on SIGTERM or SIGINT. Exit status: 0 after a clean stop, 2 for a bad config or a run directory
another coordinator holds.

The coordinator process imports no torch, gymnasium, policy or env module. It reads plain values from the compiled
config's ``system`` section: ``--config`` is either a compiled config (the run's ``config.yaml`` that
``python -m nervex.system.launch`` writes), read as it is, or the user's YAML (or any config with ``--set``
overrides), which a child process (``python -m nervex.system.launch CONFIG --print-config``) compiles against the
policy and env it names.
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import time
from typing import Any, List, Optional, Tuple

import yaml

from nervex.system.cli import build_parser as build_role_parser

COMPILE_TIMEOUT_S = 600.0
NODE_HOST = "node"
"""``--host node``: bind this node's cluster address (what its hostname resolves to), so the address and the node the
coordinator runs on always agree (Slurm picks the node)."""
DRAIN_S = 30.0
"""``--exit-when-finished``: how long a finished run's stop is served before the coordinator exits (at most)."""


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``python -m nervex.system.coordinator_start``: the shared options plus the address."""
    parser = build_role_parser(
        "coordinator",
        "Run the coordinator of a parallel nervex run (task table, leases, back-pressure) until SIGTERM or SIGINT.",
    )
    parser.add_argument(
        "--host",
        default=None,
        help="bind address (default: system.coordinator.host, 127.0.0.1); 'node': this node's cluster address",
    )
    parser.add_argument(
        "--exit-when-finished",
        action="store_true",
        help="once the run finished and every worker saw the stop (at most 30 s), stop and exit 0 (Slurm steps end "
        "on their own instead of being cancelled)",
    )
    parser.add_argument("--port", type=int, default=None, help="port (default: system.coordinator.port; 0: a free one)")
    return parser


def load_compiled_config(args: argparse.Namespace) -> Optional[Tuple[Any, str]]:
    """``(compiled config, run_dir)`` for ``--config`` and ``--set``, or None after printing the error (exit 2)."""
    from nervex.config import ConfigError, apply_overrides, read_config
    from nervex.system.system_config import compile_coordinator_config, default_run_dir, is_parallel_compiled

    try:
        cfg = apply_overrides(read_config(args.config), args.overrides)
        if args.overrides or not is_parallel_compiled(cfg):  # an override may change what system.collect resolves to
            cfg = _compile_in_child(args)
        cfg = compile_coordinator_config(cfg, source=args.config)
    except (ConfigError, FileNotFoundError) as error:
        print(f"coordinator_start: {error}", file=sys.stderr)
        return None
    return cfg, args.run_dir or default_run_dir(cfg)


def _compile_in_child(args: argparse.Namespace) -> Any:
    """The user's config compiled by ``nervex.entry`` in a child process (the policy's imports stay out of this one)."""
    from nervex.config import ConfigError

    command = [sys.executable, "-m", "nervex.system.launch", args.config, "--print-config"]
    command += [arg for item in args.overrides for arg in ("--set", item)]
    done = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S)
    if done.returncode != 0:
        raise ConfigError(done.stderr.strip() or f"compiling {args.config} failed with status {done.returncode}")
    try:
        compiled = yaml.safe_load(done.stdout)
    except yaml.YAMLError as error:
        raise ConfigError(f"`{' '.join(command)}` printed no YAML config: {error}") from None
    if not isinstance(compiled, dict):
        raise ConfigError(f"`{' '.join(command)}` printed {type(compiled).__name__}, not a config mapping")
    return compiled


def main(argv: Optional[List[str]] = None) -> int:
    """Run the coordinator until SIGTERM or SIGINT; returns the exit status."""
    args = build_parser().parse_args(argv)
    loaded = load_compiled_config(args)
    if loaded is None:
        return 2
    cfg, run_dir = loaded
    from nervex.system.coordinator import Coordinator, CoordinatorError, TaskTableError
    from nervex.system.role import StopFlag, close_role_logger, role_logger

    logger = role_logger(run_dir, "coordinator")
    stop = StopFlag()
    host = node_address() if args.host == NODE_HOST else args.host
    if args.host == NODE_HOST:
        logger.info("binding this node's address %s (%s)", host, socket.gethostname())
    coordinator = Coordinator(cfg, run_dir, host=host, port=args.port, logger=logger)
    try:
        try:
            coordinator.start()
        except (TaskTableError, CoordinatorError, OSError) as error:
            logger.error("coordinator_start: %s", error)
            return 2
        try:
            finished_at: Optional[float] = None
            while not stop.is_set():
                time.sleep(0.2)
                if args.exit_when_finished and coordinator.finished() is not None:
                    finished_at = finished_at or time.monotonic()
                    if drained(coordinator, finished_at):
                        logger.info("the run finished and its workers saw the stop; stopping")
                        break
            else:
                logger.info("received %s; stopping", stop.signal_name or "a stop request")
        finally:
            coordinator.stop()
            logger.info("coordinator stopped")
        return 0
    finally:
        stop.restore()
        close_role_logger(logger)


def node_address() -> str:
    """This node's cluster address: its hostname's, or, where that is a loopback one (Debian's ``127.0.1.1``), the
    source address of the route toward the Slurm controller's (or any outside) address."""
    name = socket.gethostname()
    try:
        address = socket.gethostbyname(name)
    except OSError:
        address = "127.0.0.1"
    if not address.startswith("127."):
        return address
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("198.18.0.1", 9))  # no packet is sent: only the route is looked up
            return str(probe.getsockname()[0])
        except OSError:
            return address


def drained(coordinator: Any, finished_at: float) -> bool:
    """Whether every live worker (seen within a lease of the end) has been answered "stop", or ``DRAIN_S`` passed."""
    if time.monotonic() - finished_at >= DRAIN_S:
        return True
    finished = coordinator.finished()
    at, by = float(finished.get("at", 0.0)), finished.get("worker_id")
    live_since = at - float(coordinator.state.settings.lease_s)
    told = coordinator.state.told_stop
    for worker in coordinator.task_table.workers():
        if worker["worker_id"] != by and float(worker["last_seen"]) >= live_since and worker["worker_id"] not in told:
            return False
    return True


if __name__ == "__main__":
    sys.exit(main())
