"""Start a node's manager: ``python -m nervex.system.manager_start --config x.yaml [--actors N] [--index I]``.

It relays its actors' requests to the coordinator and restarts actors that die; logs go to
``<run_dir>/logs/manager-<index>.log``. Under Slurm (one task per node) the index comes from ``SLURM_NODEID``.
"""

from __future__ import annotations

import sys
from typing import List, Optional

from nervex.system.cli import build_parser, forward_args, load_config, run_role


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser("manager", "Run a node's manager: relay to the coordinator, start and restart its actors.")
    parser.add_argument(
        "--actors", type=int, default=None, help="actor processes to run (default: system.manager.actors)"
    )
    parser.add_argument("--index", type=int, default=None, help="manager index (default: SLURM_NODEID, else 0)")
    args = parser.parse_args(argv)
    if args.actors is not None and args.actors < 0:
        parser.error(f"--actors must be >= 0, got {args.actors}")
    loaded = load_config("manager_start", args)
    if loaded is None:
        return 2
    cfg, run_dir = loaded
    from nervex.system.manager import ManagerRole, manager_index_from_env
    from nervex.system.role import default_worker_id

    try:
        index = args.index if args.index is not None else manager_index_from_env()
    except ValueError as error:
        print(f"manager_start: {error}", file=sys.stderr)
        return 2

    def run(logger, stop):
        worker_id = args.worker_id or default_worker_id("manager", index)
        child_args = forward_args(args)
        role = ManagerRole(
            cfg, run_dir, worker_id, child_args, index=index, actors=args.actors, url=args.url, logger=logger
        )
        role.run(stop)

    return run_role(run_dir, f"manager-{index}", run)


if __name__ == "__main__":
    sys.exit(main())
