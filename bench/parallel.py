"""The parallel mode against the serial one: collection rate, actor scaling, snapshot latency, time to 195.

Every parallel figure comes from real processes on 127.0.0.1, started the way ``python -m nervex.system.launch``
starts them (``nervex.system.launch.Launch``: coordinator, league manager, a manager that starts the actors), from
``app_zoo/classic_control/cartpole/dist/cartpole_dqn_dist.yaml``; the serial figures from the same config's parts
(``make_env_managers``, ``make_policy``, ``make_actor``) or from ``cartpole_dqn.yaml``.

1. **Collection rate** (CartPole-v1, and ``cartpole_burn``: CartPole whose step burns 1 ms of CPU, see
   ``bench/slow_env.py``). No learner trains: the bench registers as the learner and only polls the results and
   deletes their files, with the rate limiter off (``samples_per_insert: null``), so the actors collect flat out. The
   figure is env steps the coordinator accepted (``/v1/status``) per second over a window after warm-up (past
   ``learning_starts``, so the actors act with the policy's forward, not at random). The serial figure is a
   ``SerialActor`` in this process collecting tasks of the same size (``system.coordinator.n_sample``: 256) with the
   same forward, envs and exploration, over a window of the same length. Two actor processes run; while a window
   needs fewer, the others are paused with SIGSTOP (a stopped process takes no CPU; SIGCONT resumes it), so the
   serial, 1-actor and 2-actor windows alternate within each round and a slow spell of the machine falls on all.
   Two coordinator settings: ``shipped`` (the config as it is) and ``pending 64`` (``max_pending_collect: 64``): the
   coordinator tops up its queue of waiting collect tasks (at most ``max_pending_collect``, 4) in its background
   pass and at lease time; with 64 waiting tasks, a queue that runs dry is ruled out as a cause.
2. **Snapshot latency**: a real training run (stop_val out of reach, ``--probe-steps`` env steps) in which the learner
   and the actor are ``LearnerRole``/``ActorRole`` subclasses that only timestamp what they do: the learner when it
   starts to publish a snapshot (encode, storage put, ``/v1/learner/progress``), the actor when it has loaded one.
   The latency of a publish is the time until the actor has loaded that snapshot or a newer one; the path is the real
   one (league manager's choice, the coordinator's task, the manager's relay, the actor's idle back-off while the
   rate limiter holds it back).
3. **Time to 195** on CartPole DQN, per seed, interleaved: the serial command (``python -m nervex.entry.cli -m serial
   -c cartpole_dqn.yaml -s SEED``) and ``python -m nervex.system.launch cartpole_dqn_dist.yaml --actors N --set
   seed=SEED`` for N = 1 and 2. Reported: env steps and the trainer's/learner's own clock at the first evaluation
   >= 195 (``eval.csv``), and seconds from the command's start to that evaluation (``eval.csv``'s modification time:
   the row that crossed 195 is its last, as both stop there) and to the command's exit.

Targets (issue): 1 actor >= 0.8x the serial actor's rate on the same env; 2 actors >= 1.7x one actor on the 1 ms
env; every snapshot reaches the actor within 1 s on loopback; time to 195 reported next to serial.

    python bench/parallel.py                     # full run, about 8 minutes on 2 cores
    python bench/parallel.py --quick             # smoke run, about 3-4 minutes
    python bench/parallel.py --only rate --rounds 5 --window 5
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Dict, List, Optional, Sequence, TextIO, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

DIST_CONFIG = os.path.join(ROOT, "app_zoo/classic_control/cartpole/dist/cartpole_dqn_dist.yaml")
SERIAL_CONFIG = os.path.join(ROOT, "app_zoo/classic_control/cartpole/config/cartpole_dqn.yaml")
TARGET_RETURN = 195.0
RATE_TARGET = 0.8  # 1 actor / serial actor
SCALING_TARGET = 1.7  # 2 actors / 1 actor on the 1 ms env
LATENCY_TARGET_S = 1.0
ENVS = {
    "cartpole": [],
    "burn 1 ms": ["env.env_type=cartpole_burn", "env.import_names=[bench.slow_env]", "env.burn_ms=1.0"],
}
# flat-out collection: no rate limiter, room for results, leases that outlast a paused actor, no step limit
COLLECT_OVERRIDES = [
    "system.coordinator.samples_per_insert=null",
    "system.coordinator.max_queued_results=100000",
    "system.coordinator.lease_s=120",
    "max_env_step=1000000000",
]
# at most max_pending_collect (4) collect tasks wait at a time (topped up in the background pass and at lease
# time); "pending 64" rules out a queue that runs dry as a cause.
VARIANTS = {"shipped": [], "pending 64": ["system.coordinator.max_pending_collect=64"]}
WARMUP_STEPS = {"cartpole": 3000, "burn 1 ms": 1000}
SERIAL_PROGRESS_STEP = 10_000  # env step the serial actor's exploration setting is taken at (eps at its floor)
SETTLE_S = 0.5  # after pausing or resuming actors, before a window starts


# ---- processes -------------------------------------------------------------------------------------------------
def run_env() -> None:
    """Every role imports ``bench.slow_env`` from the repository root."""
    paths = [ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))


def parallel_cfg(overrides: Sequence[str]) -> Any:
    from nervex.config import apply_overrides, read_config
    from nervex.entry import compile_parallel_config

    return compile_parallel_config(apply_overrides(read_config(DIST_CONFIG), list(overrides)))


def start_roles(run_dir: str, overrides: Sequence[str], actors: int) -> Any:
    """Coordinator, league manager and a manager with ``actors`` actors, as ``nervex.system.launch`` starts them."""
    from nervex.system.launch import Launch

    launch = Launch(DIST_CONFIG, run_dir, list(overrides), actors)
    try:
        launch.start("coordinator")
        launch.wait_for_coordinator()
        launch.start("league_manager")
        launch.start("manager", ["--actors", str(actors)])
    except BaseException:
        launch.stop_all()
        raise
    return launch


def stop_roles(launch: Any, grace_s: float = 20.0) -> None:
    """Stop the manager and its actors first, while the coordinator still answers, then the rest.

    ``Launch.stop_all`` signals every role at once; an actor whose ``/v1/task/complete`` then finds no coordinator
    keeps retrying it (``RoleLink.call``, up to 120 s) in spite of its SIGTERM, so the manager would be killed after
    the 20 s grace period. Here the actors see their SIGTERM while the coordinator is up and exit in a second.
    """
    manager = launch.processes.get("manager")
    if manager is not None and manager.poll() is None:
        os.killpg(manager.pid, signal.SIGTERM)
        try:
            manager.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
    launch.stop_all()


def status_client(run_dir: str) -> Any:
    from nervex.system.comm.auth import load_or_create_token
    from nervex.system.comm.client import Client
    from nervex.system.protocol import read_coordinator_url

    return Client(read_coordinator_url(run_dir), load_or_create_token(run_dir), deadline_s=30.0)


def status(client: Any) -> Dict[str, Any]:
    from nervex.system.protocol import STATUS_PATH

    return client.post(STATUS_PATH, {})


def wait_for_actors(client: Any, n: int, timeout_s: float = 180.0) -> Dict[int, int]:
    """``{actor index: pid}`` once ``n`` actors registered (worker ids are ``actor-<index>-<host>-<pid>``)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pids = {}
        for worker in status(client)["workers"]:
            match = re.fullmatch(r"actor-(\d+)-.*-(\d+)", worker["worker_id"])
            if worker["role"] == "actor" and match:
                pids[int(match.group(1))] = int(match.group(2))
        if len(pids) >= n:
            return pids
        time.sleep(0.2)
    raise TimeoutError(f"{n} actor(s) did not register within {timeout_s:.0f} s")


def signal_pids(pids: Sequence[int], signum: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass


class Consumer(threading.Thread):
    """Stands in for the learner: polls the accepted results and deletes their files, nothing else."""

    def __init__(self, cfg: Any, run_dir: str) -> None:
        from nervex.system.comm.storage import Storage
        from nervex.system.role import RoleLink
        from nervex.system.system_config import storage_root

        super().__init__(name="bench-consumer", daemon=True)
        self.link = RoleLink(cfg, run_dir, "learner", "bench-consumer")
        self.storage = Storage(storage_root(cfg, run_dir), min_free_bytes=0)
        self.stop_event = threading.Event()
        self.seq = 0
        self.results = 0

    def run(self) -> None:
        from nervex.system.protocol import DATA_POLL_PATH

        self.link.register()
        while not self.stop_event.is_set():
            items = self.link.call(DATA_POLL_PATH, {"since_seq": self.seq, "limit": 1000}).get("items", [])
            for item in items:
                self.seq = max(self.seq, int(item["seq"]))
                self.storage.delete(item["result"]["data"])
            self.results += len(items)
            if not items:
                self.stop_event.wait(0.05)

    def close(self) -> None:
        self.stop_event.set()
        self.join(timeout=10.0)
        self.link.close()


# ---- 1. collection rate ----------------------------------------------------------------------------------------
class SerialCollector:
    """The serial actor: a ``SerialActor`` over the config's envs and collect-mode policy, one task at a time."""

    def __init__(self, cfg: Any) -> None:
        import torch

        from nervex.entry.builder import make_actor, make_env_managers, make_policy
        from nervex.system.system_config import collect_spec

        if cfg.num_threads:
            torch.set_num_threads(int(cfg.num_threads))  # as the actor process does
        env, _, env_info = make_env_managers(cfg, int(cfg.seed), evaluator=False)
        self.policy = make_policy(cfg, env_info, enable_field=["collect", "command"])
        self.actor = make_actor(cfg, env, self.policy, int(cfg.seed))
        self.spec = collect_spec(cfg)
        progress = dict(env_step=SERIAL_PROGRESS_STEP, train_iter=0, learner_step=0)
        progress.update(max_env_step=int(cfg.max_env_step), max_train_iter=int(cfg.max_train_iter))
        self.setting = self.policy.command_mode.get_setting_collect(progress)
        for _ in range(3):
            self.actor.collect(self.spec, self.setting)

    def rate(self, window_s: float) -> float:
        before, start = self.actor.env_step, time.perf_counter()
        while time.perf_counter() - start < window_s:
            self.actor.collect(self.spec, self.setting)
        return (self.actor.env_step - before) / (time.perf_counter() - start)

    def close(self) -> None:
        self.actor.close()


def parallel_rate(client: Any, window_s: float, run_dir: str) -> float:
    """Env steps per second the coordinator accepted over ``window_s``, measured between task completions.

    Counting the accepted steps between two ``/v1/status`` calls is off by up to a task at each end of the window
    (with 512-step tasks on the 1 ms env, 5 or 6 tasks fit in 3 s: a 20% step). Instead, after the window the
    coordinator's task table (read-only; ``updated_at`` is when a result was accepted, on this machine's clock) gives
    the tasks accepted within it: the rate is the env steps of all but the first over the time from the first to the
    last. Nothing is polled during the window, so the measurement takes no CPU from the roles.
    """
    import sqlite3

    first, start, wall_start = status(client)["env_steps_accepted"], time.monotonic(), time.time()
    time.sleep(window_s)
    last, end, wall_end = status(client)["env_steps_accepted"], time.monotonic(), time.time()
    db = sqlite3.connect(f"file:{os.path.join(run_dir, 'coordinator.sqlite')}?mode=ro", uri=True, timeout=10.0)
    try:
        rows = db.execute(
            "SELECT updated_at, result FROM tasks WHERE kind = 'collect' AND state = 'done' "
            "AND updated_at BETWEEN ? AND ? ORDER BY updated_at",
            (wall_start, wall_end),
        ).fetchall()
    finally:
        db.close()
    if len(rows) < 3 or rows[-1][0] - rows[0][0] < window_s / 3:
        return (last - first) / (end - start)  # too few completions to time between them
    steps = sum(int(json.loads(result)["env_steps"]) for _, result in rows[1:])
    return steps / (rows[-1][0] - rows[0][0])


def wait_for_steps(client: Any, steps: int, timeout_s: float = 300.0) -> None:
    deadline = time.monotonic() + timeout_s
    while status(client)["env_steps_accepted"] < steps:
        if time.monotonic() > deadline:
            raise TimeoutError(f"fewer than {steps} env steps accepted after {timeout_s:.0f} s")
        time.sleep(0.2)


def collection_rates(
    env: str, variant: str, rounds: int, window_s: float, work_dir: str, extra: Sequence[str] = ()
) -> Dict[str, List[float]]:
    """Serial, 1-actor and 2-actor rates on ``env``, ``rounds`` interleaved windows each (``extra``: overrides)."""
    overrides = COLLECT_OVERRIDES + ENVS[env] + VARIANTS[variant] + list(extra)
    cfg = parallel_cfg(overrides)
    run_dir = tempfile.mkdtemp(prefix="rate_", dir=work_dir)
    rates: Dict[str, List[float]] = {"serial": [], "1 actor": [], "2 actors": []}
    serial = SerialCollector(cfg)
    launch, consumer, pids = None, None, {}
    try:
        launch = start_roles(run_dir, overrides, actors=2)
        client = status_client(run_dir)
        consumer = Consumer(cfg, run_dir)
        consumer.start()
        pids = wait_for_actors(client, 2)
        wait_for_steps(client, WARMUP_STEPS[env])
        modes = list(rates)
        for r in range(rounds):
            for mode in modes[r % 3 :] + modes[: r % 3]:
                paused = {"serial": [pids[0], pids[1]], "1 actor": [pids[1]], "2 actors": []}[mode]
                signal_pids(paused, signal.SIGSTOP)
                time.sleep(SETTLE_S)
                value = serial.rate(window_s) if mode == "serial" else parallel_rate(client, window_s, run_dir)
                signal_pids(paused, signal.SIGCONT)
                rates[mode].append(value)
                load = os.getloadavg()[0]
                print(f"  {env:10s} {variant:10s} round {r + 1} {mode:9s} {value:10,.0f} env steps/s (load {load:.1f})")
    finally:
        signal_pids(list(pids.values()), signal.SIGCONT)  # a stopped process would not see SIGTERM
        if consumer is not None:
            consumer.close()
        if launch is not None:
            stop_roles(launch)
        serial.close()
        shutil.rmtree(run_dir, ignore_errors=True)
    return rates


# ---- 2. snapshot latency ---------------------------------------------------------------------------------------
def _probe_classes() -> Tuple[type, type]:
    from nervex.system.actor import ActorRole
    from nervex.system.learner import LearnerRole

    class ProbeLearner(LearnerRole):
        """The learner, recording when each snapshot's publication starts and ends."""

        record: Optional[TextIO] = None

        def _publish(self, force: bool = False) -> Optional[str]:
            start = time.time()
            name = super()._publish(force)
            if name is not None and self.record is not None:
                row = {"name": name, "policy_iter": self.train_iter, "start": start, "end": time.time()}
                self.record.write(json.dumps(row) + "\n")
                self.record.flush()
            return name

    class ProbeActor(ActorRole):
        """The actor, recording when it has loaded a new snapshot."""

        record: Optional[TextIO] = None

        def _load_snapshot(self, name: Optional[str], policy_iter: int) -> None:
            before = self.snapshot
            super()._load_snapshot(name, policy_iter)
            if self.snapshot != before and self.record is not None:
                row = {"name": self.snapshot, "loaded": time.time(), "load_s": self.last_snapshot_load_s}
                self.record.write(json.dumps(row) + "\n")
                self.record.flush()

    return ProbeLearner, ProbeActor


def probe_main(role: str, argv: List[str]) -> int:
    """``bench/parallel.py --probe learner|actor <the role's command line>``: a role that records its timestamps."""
    from nervex.system.checkpoints import StopSignals
    from nervex.system.cli import build_parser, load_config
    from nervex.system.role import StopFlag, close_role_logger, default_worker_id, role_logger

    args = build_parser(role, f"timestamped {role}").parse_args(argv)
    cfg, run_dir = load_config(f"probe {role}", args)
    logger = role_logger(run_dir, f"probe-{role}")
    learner_cls, actor_cls = _probe_classes()
    with open(os.path.join(run_dir, f"probe-{role}.jsonl"), "a", encoding="utf-8") as record:
        try:
            if role == "learner":
                signals = StopSignals().install()
                learner = learner_cls(cfg, run_dir, "learner-0", args.url, logger)
                learner.record = record
                learner.run(signals)
                signals.restore()
            else:
                stop = StopFlag()
                actor = actor_cls(cfg, run_dir, 0, default_worker_id("actor", 0), args.url, logger)
                actor.record = record
                try:
                    actor.run(stop)
                finally:
                    actor.close()
                    stop.restore()
        finally:
            close_role_logger(logger)
    return 0


def relay_url(run_dir: str, timeout_s: float = 120.0) -> str:
    """The manager's relay address, from its log."""
    path = os.path.join(run_dir, "logs", "manager-0.log")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                match = re.search(r"manager relay listening on (http://\S+)", f.read())
            if match:
                return match.group(1)
        time.sleep(0.2)
    raise TimeoutError(f"no relay address in {path} after {timeout_s:.0f} s")


def start_probe(role: str, run_dir: str, overrides: Sequence[str], extra: Sequence[str]) -> subprocess.Popen:
    command = [sys.executable, "-u", os.path.abspath(__file__), "--probe", role, "--config", DIST_CONFIG]
    command += ["--run-dir", run_dir, *[a for o in overrides for a in ("--set", o)], *extra]
    with open(os.path.join(run_dir, "logs", f"probe-{role}.stderr"), "ab") as out:
        return subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True)


def read_jsonl(path: str) -> List[Dict[str, Any]]:
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def snapshot_latency(steps: int, seed: int, work_dir: str, timeout_s: float = 300.0) -> Dict[str, Any]:
    """Latencies (s) from each publish to the actor's load of it or a newer snapshot, in a real training run."""
    overrides = [f"seed={seed}", f"max_env_step={steps}", "evaluator.stop_val=1000"]  # CartPole returns <= 500
    run_dir = tempfile.mkdtemp(prefix="snapshot_", dir=work_dir)
    launch, probes = None, []
    try:
        launch = start_roles(run_dir, overrides, actors=0)
        probes.append(start_probe("learner", run_dir, overrides, []))
        probes.append(start_probe("actor", run_dir, overrides, ["--url", relay_url(run_dir)]))
        probes[0].wait(timeout=timeout_s)
        probes[1].wait(timeout=30.0)
    finally:
        for probe in probes:
            if probe.poll() is None:
                os.killpg(probe.pid, signal.SIGTERM)
                probe.wait(timeout=30.0)
        if launch is not None:
            stop_roles(launch)
    published = read_jsonl(os.path.join(run_dir, "probe-learner.jsonl"))
    loaded = read_jsonl(os.path.join(run_dir, "probe-actor.jsonl"))
    shutil.rmtree(run_dir, ignore_errors=True)
    return match_loads(published, loaded)


def match_loads(published: List[Dict[str, Any]], loaded: List[Dict[str, Any]]) -> Dict[str, Any]:
    iters = {p["name"]: p["policy_iter"] for p in published}
    loads = sorted((row["loaded"], iters[row["name"]]) for row in loaded if row["name"] in iters)
    latencies, publish_s, censored = [], [], 0
    for p in published:
        if p["policy_iter"] == 0:
            continue  # the untrained weights the learner announces at start, before any actor exists
        publish_s.append(p["end"] - p["start"])
        later = [t for t, it in loads if it >= p["policy_iter"] and t >= p["start"]]
        if later:
            latencies.append(min(later) - p["start"])
        else:
            censored += 1  # published after the actor's last task: the run ended first
    return {
        "latencies": latencies,
        "publish_s": publish_s,
        "censored": censored,
        "loads": len(loaded),
        "load_s": [row["load_s"] for row in loaded],
    }


# ---- 3. time to 195 --------------------------------------------------------------------------------------------
def first_crossing(path: str) -> Optional[Dict[str, float]]:
    """The first ``eval.csv`` row with mean_reward >= 195, with ``last``: whether it is the file's last row."""
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    for i, row in enumerate(rows):
        if float(row["mean_reward"]) >= TARGET_RETURN:
            return dict(env_step=float(row["env_step"]), wall_time=float(row["wall_time"]), last=i == len(rows) - 1)
    return None


def timed_command(command: List[str], eval_csv: str, log: str, timeout_s: float) -> Dict[str, Any]:
    start = time.time()
    with open(log, "wb") as out:
        process = subprocess.Popen(command, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=out, stderr=out)
        try:
            code = process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGINT)
            code = process.wait()
    end = time.time()
    res: Dict[str, Any] = {"code": code, "command_s": end - start}
    crossing = first_crossing(eval_csv)
    if crossing is not None:
        res.update(env_step=crossing["env_step"], own_clock_s=crossing["wall_time"])
        if crossing["last"]:
            res["to_target_s"] = os.stat(eval_csv).st_mtime - start
    return res


def run_serial(seed: int, work_dir: str, timeout_s: float) -> Dict[str, Any]:
    name = f"serial_{seed}"
    command = [sys.executable, "-m", "nervex.entry.cli", "-m", "serial", "-c", SERIAL_CONFIG, "-s", str(seed)]
    command += ["--run-root", work_dir, "--exp-name", name, "--no-progress"]
    run_dir = os.path.join(work_dir, name)
    return timed_command(command, os.path.join(run_dir, "eval.csv"), run_dir + ".log", timeout_s)


def run_parallel(seed: int, actors: int, work_dir: str, timeout_s: float) -> Dict[str, Any]:
    run_dir = os.path.join(work_dir, f"parallel{actors}_{seed}")
    command = [sys.executable, "-m", "nervex.system.launch", DIST_CONFIG, "--actors", str(actors)]
    command += ["--run-dir", run_dir, "--timeout", str(timeout_s), "--set", f"seed={seed}"]
    return timed_command(command, os.path.join(run_dir, "eval.csv"), run_dir + ".log", timeout_s + 60)


def time_to_target(seeds: Sequence[int], work_dir: str, timeout_s: float) -> Dict[str, Dict[int, Dict[str, Any]]]:
    runs = {
        "serial": lambda s: run_serial(s, work_dir, timeout_s),
        "parallel, 1 actor": lambda s: run_parallel(s, 1, work_dir, timeout_s),
        "parallel, 2 actors": lambda s: run_parallel(s, 2, work_dir, timeout_s),
    }
    out: Dict[str, Dict[int, Dict[str, Any]]] = {mode: {} for mode in runs}
    modes = list(runs)
    for i, seed in enumerate(seeds):
        for mode in modes[i % 3 :] + modes[: i % 3]:
            res = out[mode][seed] = runs[mode](seed)
            shown = {k: round(v, 1) if isinstance(v, float) else v for k, v in res.items()}
            print(f"  seed {seed} {mode:18s} {shown}", flush=True)
    return out


# ---- report ----------------------------------------------------------------------------------------------------
def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def report_rates(all_rates: Dict[str, Dict[str, List[float]]]) -> Dict[str, float]:
    print(f"\n{'collection (env steps/s, median)':34s}{'serial':>10s}{'1 actor':>10s}{'2 actors':>10s}", end="")
    print(f"{'1 actor/serial':>16s}{'2/1 actors':>12s}")
    ratios = {}
    for env, rates in all_rates.items():
        med = {mode: statistics.median(values) for mode, values in rates.items()}
        one, two = med["1 actor"] / med["serial"], med["2 actors"] / med["1 actor"]
        ratios[f"{env}: 1 actor/serial"], ratios[f"{env}: 2/1 actors"] = one, two
        print(f"{env:34s}{med['serial']:>10,.0f}{med['1 actor']:>10,.0f}{med['2 actors']:>10,.0f}", end="")
        print(f"{one:>15.2f}x{two:>11.2f}x")
    return ratios


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def report_latency(lat: Dict[str, Any]) -> Optional[float]:
    values = lat["latencies"]
    if not values:
        print("\nsnapshot latency: no snapshot was loaded by the actor")
        return None
    print(
        f"\nsnapshot latency, publish start -> actor loaded it or a newer one ({len(values)} publishes, "
        f"{lat['censored']} after the actor's last task, {lat['loads']} loads):\n"
        f"  median {statistics.median(values) * 1e3:.0f} ms, p95 {percentile(values, 0.95) * 1e3:.0f} ms, "
        f"max {max(values) * 1e3:.0f} ms; publish itself (encode, put, progress) median "
        f"{statistics.median(lat['publish_s']) * 1e3:.1f} ms; actor's load median "
        f"{statistics.median(lat['load_s']) * 1e3:.1f} ms"
    )
    return max(values)


def report_target(runs: Dict[str, Dict[int, Dict[str, Any]]]) -> None:
    print(f"\n{'time to 195 (CartPole DQN)':24s}{'seed':>5s}{'env steps':>11s}{'own clock s':>13s}", end="")
    print(f"{'command->195 s':>16s}{'command s':>11s}")
    for mode, by_seed in runs.items():
        for seed, res in sorted(by_seed.items()):
            cells = [res.get("env_step"), res.get("own_clock_s"), res.get("to_target_s"), res["command_s"]]
            text = [
                f"{c:,.0f}" if i == 0 and c is not None else (f"{c:.1f}" if c is not None else "-")
                for i, c in enumerate(cells)
            ]
            print(f"{mode:24s}{seed:>5d}{text[0]:>11s}{text[1]:>13s}{text[2]:>16s}{text[3]:>11s}")
        reached = [r["to_target_s"] for r in by_seed.values() if "to_target_s" in r]
        if reached:
            own = statistics.median(r["own_clock_s"] for r in by_seed.values() if "own_clock_s" in r)
            print(f"{mode + ' median':29s}{'':11s}{own:>13.1f}{statistics.median(reached):>16.1f}")


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--probe":
        sys.exit(probe_main(sys.argv[2], sys.argv[3:]))
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=["rate", "latency", "target"], action="append", help="parts to run")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved windows per mode (the median is used)")
    parser.add_argument(
        "--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS), help="coordinator settings"
    )
    parser.add_argument("--window", type=float, default=3.0, help="seconds per collection window")
    parser.add_argument("--probe-steps", type=int, default=4000, help="env steps of the snapshot-latency run")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="seeds of the time-to-195 runs")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds before a time-to-195 run is stopped")
    parser.add_argument("--quick", action="store_true", help="smoke run: 1 round of 1.5 s, 1500 steps, seed 0")
    parser.add_argument("--json", help="write every measurement to this file")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="config override for the collection-rate runs, e.g. system.coordinator.n_sample=256",
    )
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.window, args.probe_steps, args.seeds = 1, 1.5, 1500, [0]
    parts = args.only or ["rate", "latency", "target"]
    run_env()
    import torch

    print(
        f"[bench] parallel mode; {platform.node()}: {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"torch {torch.__version__}; load average {os.getloadavg()[0]:.2f}; {time.strftime('%Y-%m-%d %H:%M')}"
    )
    print(f"[bench] command: {' '.join([os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:])}")
    start = time.perf_counter()
    out: Dict[str, Any] = {"load_start": os.getloadavg()[0]}
    work_dir = tempfile.mkdtemp(prefix="nervex_bench_parallel_")
    try:
        if "rate" in parts:
            out["rates"] = {
                f"{env}, {variant}": collection_rates(env, variant, args.rounds, args.window, work_dir, args.overrides)
                for variant in args.variants
                for env in ENVS
            }
        if "latency" in parts:
            print(f"  snapshot latency: a training run of {args.probe_steps} env steps", flush=True)
            out["latency"] = snapshot_latency(args.probe_steps, 0, work_dir)
        if "target" in parts:
            out["target"] = time_to_target(args.seeds, work_dir, args.timeout)
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
    out["load_end"] = os.getloadavg()[0]
    print_summary(out)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=1)
    print(f"\n[bench] done in {time.perf_counter() - start:.0f} s; load average {out['load_end']:.2f}")


def print_summary(out: Dict[str, Any]) -> None:
    checks = []
    if "rates" in out:
        ratios = report_rates(out["rates"])
        tests = (
            ("cartpole", "1 actor/serial", RATE_TARGET, "1 actor vs serial, CartPole"),
            ("burn 1 ms", "1 actor/serial", RATE_TARGET, "1 actor vs serial, 1 ms env"),
            ("burn 1 ms", "2/1 actors", SCALING_TARGET, "2 actors vs 1 actor, 1 ms env"),
        )
        for variant in VARIANTS:
            for env, ratio, target, what in tests:
                value = ratios.get(f"{env}, {variant}: {ratio}")
                if value is not None:
                    checks.append(f"[{variant}] {what} >= {target}x: {value:.2f}x {verdict(value >= target)}")
    if "latency" in out:
        worst = report_latency(out["latency"])
        if worst is not None:
            checks.append(
                f"snapshot reaches the actor within {LATENCY_TARGET_S:.0f} s (max): {worst:.3f} s "
                f"{verdict(worst <= LATENCY_TARGET_S)}"
            )
    if "target" in out:
        report_target(out["target"])
    if checks:
        print("\ntargets:\n  " + "\n  ".join(checks))


if __name__ == "__main__":
    main()
