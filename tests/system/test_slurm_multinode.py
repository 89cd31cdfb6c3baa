"""``run_slurm.sh`` on a real three-node Slurm (``local_slurm.sh --nodes 3``: nodes nvx1..nvx3, each its own network
namespace, hostname and address on one bridge, slurmctld on nvx1, one shared file system), as a new user runs it:
``NODES=3 LEARNERS=2 run_slurm.sh debug`` from nvx1, nothing else set. Slow; skipped without root or the tool; the
cluster is stopped at the end.
"""

from __future__ import annotations

import csv
import json
import os
import re
import sqlite3
import subprocess
import time
from pathlib import Path
from typing import Iterator, List, Tuple

import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
LOCAL_SLURM = REPO_ROOT.parent / "shared" / "tools" / "local_slurm.sh"
RUN_SLURM = REPO_ROOT / "app_zoo" / "classic_control" / "cartpole" / "dist" / "run_slurm.sh"
CONFIG = RUN_SLURM.parent / "cartpole_dqn_dist.yaml"
NODES = ("nvx1", "nvx2", "nvx3")


def local_slurm(*args: str, timeout: float = 600.0) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(LOCAL_SLURM), *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def cluster() -> Iterator[None]:
    if not LOCAL_SLURM.exists() or os.geteuid() != 0:
        pytest.skip(f"needs root and {LOCAL_SLURM} to start a three-node Slurm")
    started = local_slurm("--nodes", "3")
    assert started.returncode == 0, started.stderr[-2000:]
    try:
        yield
    finally:
        local_slurm("stop", timeout=120)


def long_run(max_env_step: int) -> dict:
    """cartpole_dqn_dist.yaml run to ``max_env_step`` (not stopped by the first evaluation over 195, which this
    config often reaches at 1024 env steps): long enough to see the schedule, the replay ratio, a partition."""
    cfg = yaml.safe_load(CONFIG.read_text(encoding="utf-8"))
    cfg["max_env_step"] = max_env_step
    cfg["evaluator"]["stop_val"] = 10**9
    return cfg


def counted_once(run_dir: Path) -> List[Tuple[int, str]]:
    """``(seq, samples file)`` of every accepted result, after checking that no task was completed by two leases
    and no file was accepted twice."""
    db = sqlite3.connect(f"file:{run_dir / 'coordinator.sqlite'}?mode=ro", uri=True)
    try:
        twice = db.execute("SELECT task_id FROM leases WHERE state='completed' GROUP BY task_id HAVING COUNT(*) > 1")
        assert twice.fetchall() == [], "a task completed twice"
        done = db.execute("SELECT seq, result FROM tasks WHERE state='done' ORDER BY seq").fetchall()
    finally:
        db.close()
    accepted = [(int(seq), json.loads(result)["data"]) for seq, result in done]
    assert len({name for _, name in accepted}) == len(accepted), "a samples file accepted twice"
    return accepted


def slurm_jobs() -> set:
    """The ids of the jobs slurmctld knows (asked on the cluster's network, where it answers)."""
    queue = local_slurm("exec", "nvx1", "squeue", "-h", "-o", "%i %j", timeout=60)
    assert queue.returncode == 0, queue.stderr
    return {line.split()[0] for line in queue.stdout.splitlines() if line.strip()}


def node_processes(run_dir: Path) -> List[str]:
    """The nervex processes of this run on any node (the nodes share the process table: one check sees all)."""
    out = subprocess.run(["pgrep", "-af", f"nervex.system.*{run_dir}"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if "pgrep" not in line]


def _start_run(tmp_path: Path, cfg: dict, learners: int = 1, env: str = "") -> Tuple[subprocess.Popen, Path]:
    """``run_slurm.sh`` started from nvx1 as a user would (``NODES=3``, nothing else set but ``env``), in the
    background."""
    config = tmp_path / "dqn.yaml"
    config.write_text(yaml.safe_dump(cfg), encoding="utf-8")
    run_dir = tmp_path / "run"
    command = (
        f"cd {REPO_ROOT} && RUN_DIR={run_dir} NODES=3 LEARNERS={learners} {env} "
        f"PYTHON={REPO_ROOT / '.venv' / 'bin' / 'python'} bash {RUN_SLURM} debug {config}"
    )
    script = subprocess.Popen(
        ["bash", str(LOCAL_SLURM), "exec", "nvx1", "bash", "-c", command],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    return script, run_dir


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_run_slurm_on_three_nodes_with_two_learner_ranks(cluster, tmp_path):
    cfg = long_run(20000)
    earlier = slurm_jobs()  # jobs another run left in slurmctld's saved state are not this run's
    script, run_dir = _start_run(tmp_path, cfg, learners=2)
    try:
        _, stderr = script.communicate(timeout=900)
    finally:
        if script.poll() is None:
            script.terminate()
            script.wait(timeout=60)
    logs = run_dir / "logs"
    assert script.returncode == 0, stderr[-3000:]

    with open(run_dir / "eval.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert max(float(row["mean_reward"]) for row in rows) >= 195.0  # the target reached
    # evaluations fall every eval_freq env steps (the learner keeps up: no doubling gaps)
    steps = [int(row["env_step"]) for row in rows]
    gaps = [b - a for a, b in zip(steps, steps[1:])]
    eval_freq = int(cfg["evaluator"]["eval_freq"])
    assert len(rows) >= 10 and max(gaps) < 2 * eval_freq, steps

    # the coordinator bound its own node's address and stopped cleanly, on its own
    coordinator_log = (logs / "coordinator.log").read_text()
    bound = re.search(r"binding this node's address (\S+) \((nvx\d)\)", coordinator_log)
    assert bound is not None, coordinator_log[-2000:]
    assert bound.group(1) == f"198.18.0.{10 + int(bound.group(2)[3:])}"
    assert "the run finished and its workers saw the stop; stopping" in coordinator_log
    assert "coordinator stopped" in coordinator_log
    for stderr in logs.glob("*.stderr"):
        text = stderr.read_text()
        assert "CANCELLED" not in text and "Killed" not in text, (stderr.name, text[-2000:])

    # managers on all three nodes
    managers = "".join(path.read_text() for path in logs.glob("manager*.log"))
    for node in NODES:
        assert node in managers, f"no manager on {node}"

    # two ranks kept the serial replay ratio: update_per_collect gradient steps per n_sample env steps past
    # learning_starts (within 5%)
    learner_log = (logs / "learner-0.log").read_text()
    final = re.findall(r"learner stopped \(.*\) at env_step=(\d+) train_iter=(\d+)", learner_log)
    assert final, learner_log[-2000:]
    env_step, train_iter = map(int, final[-1])
    learn = cfg["policy"]["learn"]
    owed = (env_step - learn["learning_starts"] + 8) * learn["update_per_collect"] / 8
    assert abs(train_iter - owed) <= 0.05 * owed + 64, (env_step, train_iter, owed)

    assert slurm_jobs() - earlier == set(), "a step of the run outlived it"
    assert node_processes(run_dir) == []


def _holds_lease(run_dir: Path, node: str) -> bool:
    """Whether a worker of ``node`` holds an active lease now (read-only look at the coordinator's table)."""
    try:
        db = sqlite3.connect(f"file:{run_dir / 'coordinator.sqlite'}?mode=ro", uri=True, timeout=5)
        try:
            query = "SELECT COUNT(*) FROM leases WHERE state='active' AND worker_id LIKE ?"
            return db.execute(query, (f"%-{node}-%",)).fetchone()[0] > 0
        finally:
            db.close()
    except sqlite3.Error:
        return False


def _eval_rows(run_dir: Path) -> List[dict]:
    try:
        with open(run_dir / "eval.csv", newline="") as f:
            return list(csv.DictReader(f))
    except FileNotFoundError:
        return []


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_an_actor_node_cut_off_past_its_leases_loses_them_and_the_run_counts_everything_once(cluster, tmp_path):
    """nvx3 (a manager and its actor) is cut off the network for 2.5 lease times mid-run, then healed: its leases
    run out, its tasks run elsewhere, its late results are dropped, and at the end every task was done by one lease,
    every accepted samples file is distinct and was read by the learner once, and the env steps only grew."""
    cfg = long_run(40000)
    # long tasks: a node cut while it holds a lease (waited for below) keeps it past lease_s
    cfg["system"]["coordinator"].update(n_sample=2048)
    lease_s = float(cfg["system"]["coordinator"]["lease_s"])
    script, run_dir = _start_run(tmp_path, cfg)
    try:
        deadline = time.monotonic() + 300
        while len(_eval_rows(run_dir)) < 3 or not _holds_lease(run_dir, "nvx3"):
            assert script.poll() is None and time.monotonic() < deadline, "the run did not get going"
            time.sleep(0.2)
        _partition("nvx3", 2.5 * lease_s)
        _, stderr = script.communicate(timeout=900)
    finally:
        _end(script)
    assert script.returncode == 0, stderr[-3000:]

    db = sqlite3.connect(f"file:{run_dir / 'coordinator.sqlite'}?mode=ro", uri=True)
    expired = db.execute("SELECT COUNT(*) FROM leases WHERE state='expired' AND worker_id LIKE '%nvx3%'").fetchone()
    db.close()
    assert expired[0] >= 1, "the cut lost nvx3 no lease"
    accepted = counted_once(run_dir)
    # the learner's cursor at its last checkpoint (written when it stopped): every accepted result up to it was read
    import torch

    newest = max((run_dir / "ckpt").glob("iteration_*.pt"), key=lambda p: int(p.stem.split("_")[1]))
    cursor = int(torch.load(newest, weights_only=True)["system"]["seq"])
    read = [name for seq, name in accepted if seq <= cursor]

    learner_log = (run_dir / "logs" / "learner-0.log").read_text()
    data = re.findall(
        r"learner stopped .* data: results=(\d+) dropped_stale=(\d+) missing=(\d+) bad_data=(\d+)", learner_log
    )
    assert data, learner_log[-2000:]
    results, stale, missing, bad = map(int, data[-1])
    assert (results, stale, missing, bad) == (len(read), 0, 0, 0), (data[-1], len(read), len(accepted))
    steps = [int(row["env_step"]) for row in _eval_rows(run_dir)]
    assert steps == sorted(set(steps)), steps
    coordinator_log = (run_dir / "logs" / "coordinator.log").read_text()
    assert "re-queued" in coordinator_log and "coordinator stopped" in coordinator_log
    assert node_processes(run_dir) == []


def _partition(node: str, seconds: float) -> None:
    """Cut ``node`` off the network for ``seconds``, then heal it."""
    assert local_slurm("cut", node, timeout=60).returncode == 0
    time.sleep(seconds)
    assert local_slurm("heal", node, timeout=60).returncode == 0


def _end(script: subprocess.Popen) -> None:
    """Stop run_slurm.sh if it still runs and heal every node (whatever the test left cut)."""
    if script.poll() is None:
        script.terminate()
        script.wait(timeout=60)
    for name in NODES:
        local_slurm("heal", name, timeout=60)


def _coordinator_node(run_dir: Path, deadline_s: float = 120.0) -> str:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        try:
            found = re.search(
                r"binding this node's address \S+ \((nvx\d)\)", (run_dir / "logs" / "coordinator.log").read_text()
            )
        except FileNotFoundError:
            found = None
        if found:
            return found.group(1)
        time.sleep(0.5)
    raise AssertionError("the coordinator never logged its node")


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_the_coordinators_node_cut_off_for_30_s_and_healed_the_roles_retry_and_the_run_goes_on(cluster, tmp_path):
    cfg = long_run(30000)
    script, run_dir = _start_run(tmp_path, cfg)
    try:
        node = _coordinator_node(run_dir)
        deadline = time.monotonic() + 300
        while len(_eval_rows(run_dir)) < 3:
            assert script.poll() is None and time.monotonic() < deadline, "the run did not get going"
            time.sleep(0.5)
        before = len(_eval_rows(run_dir))
        _partition(node, 30.0)
        _, stderr = script.communicate(timeout=900)
    finally:
        _end(script)
    assert script.returncode == 0, stderr[-3000:]
    rows = _eval_rows(run_dir)
    assert len(rows) > before + 3 and int(rows[-1]["env_step"]) >= 30000 - 2048  # it went on to the end after the heal
    steps = [int(row["env_step"]) for row in rows]
    assert steps == sorted(set(steps)), steps
    logs = run_dir / "logs"
    retried = "".join(path.read_text() for path in logs.glob("*.log") if path.name != "coordinator.log")
    assert "retrying" in retried, "no role noticed the cut"
    counted_once(run_dir)
    assert "coordinator stopped" in (logs / "coordinator.log").read_text()
    assert node_processes(run_dir) == []


def _step_nodes(name_prefix: str) -> List[str]:
    """The nodes of the running step whose name starts with ``name_prefix`` (``squeue -s`` on nvx1)."""
    listed = local_slurm("exec", "nvx1", "squeue", "-h", "-s", "-o", "%j %N", timeout=60).stdout
    for line in listed.splitlines():
        name, _, nodes = line.strip().partition(" ")
        if name.startswith(name_prefix):
            found = re.fullmatch(r"nvx\[(\d)-(\d)\]|nvx\[(\d),(\d)\]|nvx(\d)", nodes.strip())
            if found:
                return [f"nvx{n}" for n in _expand(found)]
    return []


def _expand(found: re.Match[str]) -> List[int]:
    first, last, one, two, alone = found.groups()
    if first:
        return list(range(int(first), int(last) + 1))
    return [int(one), int(two)] if one else [int(alone)]


def _log_time(line: str) -> float:
    stamp = re.match(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3})\]", line)
    assert stamp is not None, line
    return time.mktime(time.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S")) + int(stamp.group(2)) / 1000


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_a_learner_ranks_node_cut_off_fails_the_group_within_its_timeout_and_the_step_resumes(cluster, tmp_path):
    """Two learner ranks on two nodes (``LEARNER_NODES=2``); the node of one (not the coordinator's) is cut off for
    longer than ``dist_timeout_s``: the other rank's all-reduce fails within ``dist_timeout_s``, the learner step ends,
    run_slurm.sh starts it again once the node is back, the new ranks resume from the newest checkpoint, and the run
    reaches its end with every result counted once and the env steps only growing."""
    dist_timeout_s = 20.0
    cfg = long_run(40000)
    cfg["system"].setdefault("learner", {}).update(dist_timeout_s=dist_timeout_s, checkpoint_interval_min=0.25)
    script, run_dir = _start_run(tmp_path, cfg, learners=2, env="LEARNER_NODES=2")
    logs = run_dir / "logs"
    try:
        coordinator = _coordinator_node(run_dir)
        deadline = time.monotonic() + 400
        while len(_eval_rows(run_dir)) < 3 or not list((run_dir / "ckpt").glob("iteration_*.pt")):
            assert script.poll() is None and time.monotonic() < deadline, "the run did not get going"
            time.sleep(0.5)
        ranks = _step_nodes("nervex-learner-")
        assert len(ranks) == 2, ranks  # one rank per node
        node = next(n for n in ranks if n != coordinator)
        cut_at = time.time()
        _partition(node, dist_timeout_s + 25.0)
        _, stderr = script.communicate(timeout=1000)
    finally:
        _end(script)
    assert script.returncode == 0, stderr[-3000:]

    # the rank that kept the network saw the group fail within dist_timeout_s (plus the step it was in)
    survivor = ranks.index(next(n for n in ranks if n != node))
    survivor_log = (logs / f"learner-{survivor}.log").read_text()
    assert "gradient all-reduce failed" in survivor_log, survivor_log[-3000:]
    failures = [line for line in survivor_log.splitlines() if line.startswith("[") and " ERROR " in line]
    failures = [line for line in failures if _log_time(line) > cut_at]  # "learner-<rank> failed", then its traceback
    assert failures, survivor_log[-3000:]
    assert _log_time(failures[0]) - cut_at <= dist_timeout_s + 15.0, failures[0]
    # run_slurm.sh started the step again: rank 0 registered anew after the cut, having resumed from a checkpoint
    rank0 = (logs / "learner-0.log").read_text().splitlines()
    registered = [line for line in rank0 if "registered learner learner-0" in line]
    resumed = [line for line in rank0 if "resumed from" in line and "ckpt" in line]
    assert len(registered) >= 2 and _log_time(registered[-1]) > cut_at, registered
    assert resumed and _log_time(resumed[-1]) > cut_at, resumed

    rows = _eval_rows(run_dir)
    steps = [int(row["env_step"]) for row in rows]
    assert steps == sorted(set(steps)) and steps[-1] >= 40000 - 2048, steps
    counted_once(run_dir)
    assert "coordinator stopped" in (logs / "coordinator.log").read_text()
    assert node_processes(run_dir) == []
