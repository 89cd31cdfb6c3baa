"""``run_slurm.sh PARTITION`` under a real one-node Slurm (slurm-wlm + munge), started by the workplace's
``local_slurm.sh``: every role as its own ``srun`` step, the learner step with ``--kill-on-bad-exit=1``. Slow (it
may install Debian packages); skipped where the tool or root is missing."""

from __future__ import annotations

import csv
import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
LOCAL_SLURM = REPO_ROOT.parent / "shared" / "tools" / "local_slurm.sh"
RUN_SLURM = REPO_ROOT / "app_zoo" / "classic_control" / "cartpole" / "dist" / "run_slurm.sh"


@pytest.mark.slow
def test_run_slurm_reaches_195_under_a_real_slurm(tmp_path):
    if not LOCAL_SLURM.exists() or os.geteuid() != 0:
        pytest.skip(f"needs root and {LOCAL_SLURM} to start a local Slurm")
    subprocess.run(["bash", str(LOCAL_SLURM)], check=True, timeout=600)
    assert shutil.which("srun"), "local_slurm.sh did not install srun"
    partition = subprocess.run(["sinfo", "-h", "-o", "%R"], capture_output=True, text=True).stdout.split()[0]
    run_dir = tmp_path / "run"
    env = dict(os.environ, RUN_DIR=str(run_dir), PYTHON=str(REPO_ROOT / ".venv" / "bin" / "python"))
    done = subprocess.run(
        ["bash", str(RUN_SLURM), partition], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    with open(run_dir / "eval.csv", newline="") as f:
        assert float(list(csv.DictReader(f))[-1]["mean_reward"]) >= 195.0
    queue = subprocess.run(["squeue", "-h", "-n", "nervex-coordinator"], capture_output=True, text=True).stdout
    assert not queue.strip(), f"the coordinator step outlived the run: {queue}"
