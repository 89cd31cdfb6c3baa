"""Start the learner of a parallel run: ``python -m nervex.system.learner_start --config x.yaml``.

Several ranks form one data-parallel learner when started by ``srun --ntasks=N`` or ``torchrun`` (ranks from
``SLURM_PROCID``/``SLURM_NTASKS`` or torchrun's variables; see ``nervex.system.distributed``); rank 0 talks to the
coordinator. SIGUSR1 writes a checkpoint; SIGTERM/SIGINT write one and stop. Logs: ``<run_dir>/logs/learner-<rank>.log``.
"""

from __future__ import annotations

import sys
from typing import List, Optional

from nervex.system.cli import build_parser, load_config, run_role


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser(
        "learner", "Run the learner of a parallel nervex run: train on announced data, publish snapshots, evaluate."
    )
    args = parser.parse_args(argv)
    loaded = load_config("learner_start", args)
    if loaded is None:
        return 2
    cfg, run_dir = loaded
    from nervex.system.checkpoints import StopSignals
    from nervex.system.distributed import dist_info_from_env
    from nervex.system.learner import LearnerRole

    try:
        dist = dist_info_from_env()
    except ValueError as error:
        print(f"learner_start: {error}", file=sys.stderr)
        return 2

    def run(logger, signals):
        role_dist = dist if dist.world_size > 1 else None
        role = LearnerRole(cfg, run_dir, args.worker_id or f"learner-{dist.rank}", args.url, logger, dist=role_dist)
        logger.info("learner finished: %s", role.run(signals))

    return run_role(run_dir, f"learner-{dist.rank}", run, StopSignals().install())


if __name__ == "__main__":
    sys.exit(main())
