"""``run_slurm.sh`` on a real three-node Slurm (``local_slurm.sh --nodes 3``: nodes nvx1..nvx3, each its own network
namespace, hostname and address on one bridge, slurmctld on nvx1, one shared file system), as a new user runs it:
``NODES=3 LEARNERS=2 run_slurm.sh debug`` from nvx1, nothing else set. Slow; skipped without root or the tool; the
cluster is stopped at the end.
"""

from __future__ import annotations

import csv
import os
import re
import subprocess
from pathlib import Path
from typing import Iterator, List

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


def node_processes(run_dir: Path) -> List[str]:
    """The nervex processes of this run on any node (the nodes share the process table: one check sees all)."""
    out = subprocess.run(["pgrep", "-af", f"nervex.system.*{run_dir}"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if "pgrep" not in line]


@pytest.mark.slow
def test_run_slurm_on_three_nodes_with_two_learner_ranks(cluster, tmp_path):
    cfg = yaml.safe_load(CONFIG.read_text(encoding="utf-8"))
    config = tmp_path / "dqn.yaml"
    config.write_text(yaml.safe_dump(cfg), encoding="utf-8")
    run_dir = tmp_path / "run"
    command = (
        f"cd {REPO_ROOT} && RUN_DIR={run_dir} NODES=3 LEARNERS=2 PYTHON={REPO_ROOT / '.venv' / 'bin' / 'python'} "
        f"bash {RUN_SLURM} debug {config}"
    )
    done = local_slurm("exec", "nvx1", "bash", "-c", command, timeout=900)
    logs = run_dir / "logs"
    assert done.returncode == 0, done.stderr[-3000:]

    with open(run_dir / "eval.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert float(rows[-1]["mean_reward"]) >= 195.0
    # evaluations fall every eval_freq env steps (the learner keeps up: no doubling gaps)
    steps = [int(row["env_step"]) for row in rows]
    gaps = [b - a for a, b in zip(steps, steps[1:])]
    eval_freq = int(cfg["evaluator"]["eval_freq"])
    assert max(gaps) < 3 * eval_freq, steps

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
        assert node in managers or node in done.stderr, f"no manager on {node}"

    # two ranks kept the serial replay ratio: update_per_collect gradient steps per n_sample env steps past
    # learning_starts (within 5%)
    learner_log = (logs / "learner-0.log").read_text()
    final = re.findall(r"learner stopped \(.*\) at env_step=(\d+) train_iter=(\d+)", learner_log)
    assert final, learner_log[-2000:]
    env_step, train_iter = map(int, final[-1])
    learn = cfg["policy"]["learn"]
    owed = (env_step - learn["learning_starts"] + 8) * learn["update_per_collect"] / 8
    assert abs(train_iter - owed) <= 0.05 * owed + 64, (env_step, train_iter, owed)

    queue = subprocess.run(["squeue", "-h"], capture_output=True, text=True).stdout
    assert not queue.strip(), queue
    assert node_processes(run_dir) == []
