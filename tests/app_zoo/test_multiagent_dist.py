"""The cooperative multi-agent configs in the parallel mode: coordinator, learner, manager and actors as processes on
127.0.0.1 (``python -m nervex.system.launch``, what ``./run.sh dist`` runs), samples through real files."""

from __future__ import annotations

import csv
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import pytest

pytest.importorskip("mpe2")

REPO_ROOT = Path(__file__).resolve().parents[2]
DIST = REPO_ROOT / "app_zoo" / "multiagent"


def launch(config: Path, run_dir: Path, timeout: float, *overrides: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "nervex.system.launch", str(config), "--run-dir", str(run_dir)]
    command += ["--timeout", str(int(timeout)), "--set", "num_threads=1"]
    for item in overrides:
        command += ["--set", item]
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), OMP_NUM_THREADS="1")
    return subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout + 60)


def eval_rows(run_dir: Path) -> List[Dict[str, str]]:
    with open(run_dir / "eval.csv", newline="") as f:
        return list(csv.DictReader(f))


def accepted_collect_tasks(run_dir: Path) -> int:
    conn = sqlite3.connect(run_dir / "coordinator.sqlite")
    try:
        return conn.execute("SELECT COUNT(*) FROM tasks WHERE kind='collect' AND state='done'").fetchone()[0]
    finally:
        conn.close()


def test_qmix_two_step_game_reaches_8_in_the_parallel_mode(tmp_path):
    """QMIX's greedy joint policy earns the optimum 8 with the actor in its own process (~30 s); the evaluation
    columns of a many-agent env (team return, per-agent returns) reach the learner's eval.csv."""
    run_dir = tmp_path / "run"
    done = launch(DIST / "two_step" / "dist" / "two_step_qmix_dist.yaml", run_dir, 240)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = eval_rows(run_dir)
    assert float(rows[-1]["mean_reward"]) == 8.0
    assert float(rows[-1]["team_return_sum"]) == 16.0  # two agents, each given the team's 8
    assert float(rows[-1]["return/agent_0"]) == 8.0
    assert accepted_collect_tasks(run_dir) >= 2


@pytest.mark.slow
def test_mappo_two_step_game_reaches_8_in_the_parallel_mode(tmp_path):
    run_dir = tmp_path / "run"
    done = launch(DIST / "two_step" / "dist" / "two_step_mappo_dist.yaml", run_dir, 300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert float(eval_rows(run_dir)[-1]["mean_reward"]) == 8.0


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["qmix", "mappo"])
def test_simple_spread_configs_train_in_the_parallel_mode(tmp_path, algo):
    """The shipped simple_spread dist configs with 2 actors, 12k env steps: the learner trains on the actors' samples
    and evaluates on the env's own figures (coverage from ``episode_stats``)."""
    run_dir = tmp_path / "run"
    config = DIST / "mpe" / "dist" / f"simple_spread_{algo}_dist.yaml"
    done = launch(config, run_dir, 400, "max_env_step=12000", "evaluator.eval_freq=4000", "evaluator.n_episode=4")
    assert done.returncode == 0, done.stderr[-3000:]
    rows = eval_rows(run_dir)
    assert int(rows[-1]["train_iter"]) > 0
    assert -200.0 < float(rows[-1]["team_return_sum"]) < 0.0  # 25 steps of negative distances, summed over 3 agents
    assert accepted_collect_tasks(run_dir) >= 3
