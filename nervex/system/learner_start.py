"""Start the learner of a parallel run: ``python -m nervex.system.learner_start --config x.yaml``.

Several ranks form one data-parallel learner when started by ``srun --ntasks=N`` or ``torchrun`` (ranks from
``SLURM_PROCID``/``SLURM_NTASKS`` or torchrun's variables; see ``nervex.system.distributed``); rank 0 talks to the
coordinator. SIGUSR1 writes a checkpoint; SIGTERM/SIGINT write one and stop. Logs: ``<run_dir>/logs/learner-<rank>.log``.
"""

from __future__ import annotations

import sys
from typing import List, Optional

from nervex.system.cli import build_parser, load_config


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
    from nervex.system.worker import WorkerExit, close_role_logger, role_logger

    try:
        dist = dist_info_from_env()
    except ValueError as error:
        print(f"learner_start: {error}", file=sys.stderr)
        return 2
    logger = role_logger(run_dir, f"learner-{dist.rank}")
    signals = StopSignals().install()
    try:
        role = LearnerRole(
            cfg,
            run_dir,
            args.worker_id or f"learner-{dist.rank}",
            args.url,
            logger,
            dist=dist if dist.world_size > 1 else None,
        )
        reason = role.run(signals)
        logger.info("learner finished: %s", reason)
    except WorkerExit as error:
        logger.error("%s", error)
        return error.code
    except Exception:
        logger.exception("learner rank %d failed", dist.rank)
        return 1
    finally:
        signals.restore()
        close_role_logger(logger)
    return 0


if __name__ == "__main__":
    sys.exit(main())
