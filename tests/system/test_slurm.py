"""``run_slurm.sh PARTITION`` under a real one-node Slurm (slurm-wlm + munge), started by the workplace's
``local_slurm.sh``: every role as its own ``srun`` step, the learner step with ``--kill-on-bad-exit=1``. Slow (it
may install Debian packages); skipped where the tool or root is missing."""

from __future__ import annotations

import csv
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Iterator

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
LOCAL_SLURM = REPO_ROOT.parent / "shared" / "tools" / "local_slurm.sh"
RUN_SLURM = REPO_ROOT / "app_zoo" / "classic_control" / "cartpole" / "dist" / "run_slurm.sh"


@pytest.fixture
def partition() -> Iterator[str]:
    """A real one-node Slurm (``local_slurm.sh``) for the test, stopped at its end; its partition's name."""
    if not LOCAL_SLURM.exists() or os.geteuid() != 0:
        pytest.skip(f"needs root and {LOCAL_SLURM} to start a local Slurm")
    subprocess.run(["bash", str(LOCAL_SLURM)], check=True, timeout=600)
    try:
        assert shutil.which("srun"), "local_slurm.sh did not install srun"
        yield subprocess.run(["sinfo", "-h", "-o", "%R"], capture_output=True, text=True).stdout.split()[0]
    finally:
        subprocess.run(["bash", str(LOCAL_SLURM), "stop"], capture_output=True, timeout=120)


@pytest.mark.slow
def test_run_slurm_reaches_195_under_a_real_slurm(tmp_path, partition):
    run_dir = tmp_path / "run"
    env = dict(os.environ, RUN_DIR=str(run_dir), PYTHON=str(REPO_ROOT / ".venv" / "bin" / "python"))
    done = subprocess.run(
        ["bash", str(RUN_SLURM), partition], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    with open(run_dir / "eval.csv", newline="") as f:
        assert float(list(csv.DictReader(f))[-1]["mean_reward"]) >= 195.0
    queue = subprocess.run(["squeue", "-h", "-o", "%j"], capture_output=True, text=True).stdout
    assert "nervex-" not in queue, f"a step outlived the run: {queue}"
    coordinator_log = (run_dir / "logs" / "coordinator.log").read_text()
    assert "the run finished and its workers saw the stop; stopping" in coordinator_log  # it ended on its own
    for stderr in (run_dir / "logs").glob("*.stderr"):
        assert "CANCELLED" not in stderr.read_text(), stderr.name


@pytest.mark.slow
def test_a_killed_learner_rank_is_started_again_by_run_slurm_and_resumes(tmp_path, partition):
    """kill -9 the learner rank under Slurm: ``--kill-on-bad-exit`` ends the step with an error, run_slurm.sh starts
    the step again, and the new rank resumes from the newest checkpoint and reaches 195. The league manager is killed
    too, and started again the same way."""
    import yaml

    with open(RUN_SLURM.parent / "cartpole_dqn_dist.yaml", encoding="utf-8") as f:
        cfg = yaml.safe_load(f)
    cfg["evaluator"]["eval_freq"] = 4000  # not at 195 before the kill
    cfg["system"]["learner"] = dict(cfg["system"].get("learner") or {}, checkpoint_interval_min=0.02)
    config = tmp_path / "dqn.yaml"
    config.write_text(yaml.safe_dump(cfg), encoding="utf-8")
    run_dir = tmp_path / "run"
    env = dict(os.environ, RUN_DIR=str(run_dir), LEARNER_RESTARTS="2")
    env["PYTHON"] = str(REPO_ROOT / ".venv" / "bin" / "python")
    script = subprocess.Popen(
        ["bash", str(RUN_SLURM), partition, str(config)], cwd=REPO_ROOT, env=env, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 240
        while not list((run_dir / "ckpt").glob("iteration_*.pt")):
            assert time.monotonic() < deadline and script.poll() is None, "no checkpoint before the kill"
            time.sleep(0.2)
        for role in ("league_manager", "learner"):
            pids = subprocess.run(["pgrep", "-f", f"{role}_start.*{run_dir}"], capture_output=True, text=True).stdout
            assert pids.split(), f"no {role} process"
            for pid in pids.split():
                os.kill(int(pid), signal.SIGKILL)
        _, stderr = script.communicate(timeout=600)
    finally:
        if script.poll() is None:
            script.terminate()
            script.wait(timeout=60)
    assert script.returncode == 0, stderr[-3000:]
    assert "starting the learner step again from its newest checkpoint (1 of 2)" in stderr
    assert "starting the league manager step again (1 of 3)" in stderr
    league_log = (run_dir / "logs" / "league_manager.log").read_text()
    assert league_log.count("registered league_manager") == 2, league_log[-2000:]
    with open(run_dir / "eval.csv", newline="") as f:
        assert float(list(csv.DictReader(f))[-1]["mean_reward"]) >= 195.0
    assert "resumed from" in (run_dir / "logs" / "learner-0.log").read_text()
