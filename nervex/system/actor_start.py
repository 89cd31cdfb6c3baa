"""Start an actor of a parallel run: ``python -m nervex.system.actor_start --config x.yaml [--index I]``.

It registers with the coordinator (found in ``<run_dir>/coordinator.url``, or at ``--url``), then leases collect
tasks until the run finishes or SIGTERM/SIGINT; logs go to ``<run_dir>/logs/actor-<index>.log``.
"""

from __future__ import annotations

import sys
from typing import List, Optional

from nervex.system.cli import build_parser, load_config, run_role


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser("actor", "Run one actor of a parallel nervex run: lease collect tasks, act, store samples.")
    parser.add_argument("--index", type=int, default=0, help="actor index: seeds its envs apart (default 0)")
    args = parser.parse_args(argv)
    loaded = load_config("actor_start", args)
    if loaded is None:
        return 2
    cfg, run_dir = loaded
    from nervex.system.actor import ActorRole
    from nervex.system.role import default_worker_id

    def run(logger, stop):
        worker_id = args.worker_id or default_worker_id("actor", args.index)
        role = ActorRole(cfg, run_dir, args.index, worker_id, args.url, logger)
        try:
            role.run(stop)
        finally:
            role.close()

    return run_role(run_dir, f"actor-{args.index}", run)


if __name__ == "__main__":
    sys.exit(main())
