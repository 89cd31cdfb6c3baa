"""Start the league manager of a parallel run: ``python -m nervex.system.league_manager_start --config x.yaml``.

Logs go to ``<run_dir>/logs/league_manager.log``; it stops when the run finishes or on SIGTERM/SIGINT.
"""

from __future__ import annotations

import sys
from typing import List, Optional

from nervex.system.cli import build_parser, load_config, run_role


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser(
        "league_manager", "Run the league manager of a parallel nervex run: players, snapshots, what actors play."
    )
    args = parser.parse_args(argv)
    loaded = load_config("league_manager_start", args)
    if loaded is None:
        return 2
    cfg, run_dir = loaded
    from nervex.system.league_manager import LeagueManagerRole
    from nervex.system.role import default_worker_id

    def run(logger, stop):
        worker_id = args.worker_id or default_worker_id("league_manager")
        LeagueManagerRole(cfg, run_dir, worker_id, args.url, logger).run(stop)

    return run_role(run_dir, "league_manager", run)


if __name__ == "__main__":
    sys.exit(main())
