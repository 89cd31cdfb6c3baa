"""One ``ActorRole`` in this process talking to the coordinator directly (no manager relay): where its time goes.

Starts a coordinator and a league manager (``nervex.system.launch.Launch``) from ``cartpole_dqn_dist.yaml`` with
``bench/parallel.py``'s flat-out collection overrides, stands in for the learner with ``parallel.Consumer``, runs the
actor for SECONDS and prints its env steps per second and the seconds each phase took (the actor's thread:
collect, snapshot, wait, idle; its I/O thread: encode; its I/O process, or the I/O thread with
``system.actor.io_process=false``: lease, store, complete).

    python bench/actor_probe.py 10                                   # prefetch on (the default)
    python bench/actor_probe.py 10 system.actor.prefetch=false       # one task at a time
    python bench/actor_probe.py 10 system.actor.io_process=false     # round trips on the I/O thread
    python bench/actor_probe.py 10 system.coordinator.n_sample=64    # any other override
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))

import parallel as bench  # noqa: E402


def main() -> None:
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 10.0
    overrides = bench.COLLECT_OVERRIDES + ["system.coordinator.max_pending_collect=64"] + sys.argv[2:]
    bench.run_env()
    from nervex.system.actor import ActorRole
    from nervex.system.launch import Launch

    cfg = bench.parallel_cfg(overrides)
    run_dir = tempfile.mkdtemp(prefix="actor_probe_")
    launch = Launch(bench.DIST_CONFIG, run_dir, list(overrides), 0)
    launch.start("coordinator")
    launch.wait_for_coordinator()
    launch.start("league_manager")
    consumer = bench.Consumer(cfg, run_dir)
    consumer.start()
    actor = ActorRole(cfg, run_dir, 0, "actor-probe")
    stop = threading.Event()
    threading.Timer(seconds, stop.set).start()
    try:
        start = time.perf_counter()
        tasks = actor.run(stop)
        elapsed = time.perf_counter() - start
        phases = ", ".join(f"{k} {v:.2f} s" for k, v in actor.phase_s.items())
        print(f"{tasks} tasks, {actor.actor.env_step / elapsed:,.0f} env steps/s over {elapsed:.1f} s; {phases}")
    finally:
        actor.actor.close()
        consumer.close()
        launch.stop_all()


if __name__ == "__main__":
    main()
