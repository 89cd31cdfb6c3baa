"""The parallel mode end to end: real role processes on loopback, learning to the target, and the faults that must
not lose or duplicate data (killed and stopped actors, a killed coordinator, a killed learner).

Each test asserts exact counters read from the run directory's SQLite files and checkpoints: every accepted collect
task is done once, its samples file is named by its SHA-256 and named by no other result, and the learner's env steps
equal the env steps the coordinator accepted.
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import pytest
import torch

from nervex.config import read_config
from nervex.system.launch import Launch
from nervex.system.protocol import read_coordinator_url
from nervex.torch_utils import load_checkpoint

REPO_ROOT = Path(__file__).resolve().parents[2]
DIST = REPO_ROOT / "app_zoo" / "classic_control" / "cartpole" / "dist"
DQN = DIST / "cartpole_dqn_dist.yaml"
PPO = DIST / "cartpole_ppo_dist.yaml"
ENV = dict(os.environ, PYTHONPATH=str(REPO_ROOT), OMP_NUM_THREADS="1")


def launch(config: Path, run_dir: Path, actors: int, timeout: float, *overrides: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "nervex.system.launch", str(config), "--run-dir", str(run_dir)]
    command += ["--actors", str(actors), "--timeout", str(timeout)]
    for item in ("num_threads=1", *overrides):
        command += ["--set", item]
    return subprocess.run(command, cwd=REPO_ROOT, env=ENV, capture_output=True, text=True, timeout=timeout + 60)


def eval_rows(run_dir: Path) -> List[Dict[str, str]]:
    with open(run_dir / "eval.csv", newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def accepted_results(run_dir: Path) -> List[Dict[str, Any]]:
    """The done collect tasks of the coordinator's task table, with their results."""
    conn = sqlite3.connect(run_dir / "coordinator.sqlite")
    try:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        assert "tasks" in tables, tables
        columns = [r[1] for r in conn.execute("PRAGMA table_info(tasks)")]
        rows = conn.execute("SELECT * FROM tasks WHERE kind='collect' AND state='done'").fetchall()
    finally:
        conn.close()
    out = []
    for row in rows:
        record = dict(zip(columns, row))
        record["result"] = json.loads(record["result"])
        out.append(record)
    return out


def latest_checkpoint(run_dir: Path) -> Dict[str, Any]:
    ckpts = sorted((run_dir / "ckpt").glob("iteration_*.pt"), key=lambda p: int(p.stem.split("_")[1]))
    assert ckpts, "the learner wrote no checkpoint"
    return load_checkpoint(ckpts[-1])


def assert_exact_accounting(run_dir: Path) -> None:
    """Every accepted task once, every samples file named once, learner env steps == accepted env steps."""
    results = accepted_results(run_dir)
    assert results, "no collect task was accepted"
    ids = [r["task_id"] for r in results]
    names = [r["result"]["data"] for r in results]
    assert len(set(ids)) == len(ids)
    assert len(set(names)) == len(names), "two accepted results name the same samples file"
    state = latest_checkpoint(run_dir)
    cursor = int(state["system"]["seq"])
    assert sorted(int(r["seq"]) for r in results) == list(range(1, len(results) + 1)), "a gap in the result sequence"
    # exactly the results up to the learner's poll cursor were ingested, each once
    read_steps = sum(int(r["result"]["env_steps"]) for r in results if int(r["seq"]) <= cursor)
    assert 0 < cursor <= len(results)
    assert state["env_step"] == read_steps


def no_role_left(run_dir: Path) -> None:
    out = subprocess.run(["pgrep", "-f", str(run_dir)], capture_output=True, text=True).stdout.split()
    assert not out, f"role processes left alive: {out}"


# ---------------------------------------------------------------------------------------------------- learning


@pytest.mark.parametrize("actors", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_dqn_dist_reaches_195(tmp_path, actors):
    run_dir = tmp_path / "run"
    done = launch(DQN, run_dir, actors, 240)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = eval_rows(run_dir)
    assert float(rows[-1]["mean_reward"]) >= 195.0
    # as in serial mode, each evaluation comes after the gradient steps owed for the data so far: 4 per 8 env steps
    # after learning_starts (500)
    for row in rows:
        assert int(row["train_iter"]) >= (int(row["env_step"]) - 500) // 2, row
    assert_exact_accounting(run_dir)
    # the run directory of a serial run, plus a log per role
    for name in ("config.yaml", "eval.csv", "run_token", "coordinator.sqlite", "league.sqlite"):
        assert (run_dir / name).exists(), name
    assert list(run_dir.glob("events.out.tfevents.*")), "no TensorBoard events"
    logs = {p.name for p in (run_dir / "logs").glob("*.log")}
    assert {"coordinator.log", "learner-0.log", "league_manager.log", "manager-0.log"} <= logs
    assert {f"actor-{i}.log" for i in range(actors)} <= logs
    assert oct((run_dir / "run_token").stat().st_mode & 0o777) == "0o600"
    # every server binds the loopback unless the config names another address
    assert read_coordinator_url(str(run_dir)).startswith("http://127.0.0.1:")
    assert "manager relay listening on http://127.0.0.1:" in (run_dir / "logs" / "manager-0.log").read_text()
    no_role_left(run_dir)
    # the learner's snapshots, chosen by the league manager, reached the actors: with 512-step tasks the run may end
    # after two tasks, both leased before the first trained snapshot, so the actor's last loaded snapshot is checked
    # (an idle actor loads the newest while the rate limiter holds it back); no result claims a snapshot from the future
    train_iter = latest_checkpoint(run_dir)["train_iter"]
    assert all(0 <= r["result"]["policy_iter"] <= train_iter for r in accepted_results(run_dir))
    for i in range(actors):
        stop_line = re.search(
            r"stops after \d+ task\(s\) with the snapshot of policy_iter (\d+)", actor_log(run_dir, i)
        )
        assert stop_line is not None and 0 < int(stop_line.group(1)) <= train_iter, f"actor {i}"
    assert "main" in _league_players(run_dir)


def actor_log(run_dir: Path, index: int) -> str:
    return (run_dir / "logs" / f"actor-{index}.log").read_text()


def _league_players(run_dir: Path) -> List[str]:
    conn = sqlite3.connect(run_dir / "league.sqlite")
    try:
        return [r[0] for r in conn.execute("SELECT player_id FROM players")]
    finally:
        conn.close()


@pytest.mark.slow  # ~40 s; the default suite keeps on-policy parallel learning in test_learner's bitwise PPO check
def test_ppo_dist_reaches_475_with_2_actors(tmp_path):
    """Two actors and the learner reach 475 within max_env_step (100k).

    A parallel run is not reproducible step for step (when each rollout arrives depends on timing), and about one run
    in 30 stalls far below 475 until the budget runs out (58 of 60 reached 475 on the project's VM, docs/benchmarks.md).
    A second run, seed 1, is launched only when the first stays below 475: the test fails when both do (~0.1% at
    that rate), and every run must stop cleanly with exact accounting."""
    finals = []
    for seed in (0, 1):
        run_dir = tmp_path / f"run-seed{seed}"
        done = launch(PPO, run_dir, 2, 300, f"seed={seed}")
        assert done.returncode == 0, done.stderr[-3000:]
        assert_exact_accounting(run_dir)
        no_role_left(run_dir)
        finals.append(float(eval_rows(run_dir)[-1]["mean_reward"]))
        if finals[-1] >= 475.0:
            return
    pytest.fail(f"neither run reached 475 within max_env_step: last evaluations {finals}")


@pytest.mark.slow
def test_ppo_dist_reaches_475_with_1_actor(tmp_path):
    run_dir = tmp_path / "run"
    done = launch(PPO, run_dir, 1, 600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert float(eval_rows(run_dir)[-1]["mean_reward"]) >= 475.0


def test_launch_stops_every_role_when_one_dies(tmp_path):
    """A role killed mid-run: launch names it, stops the others and exits 1."""
    run_dir = tmp_path / "run"
    command = [sys.executable, "-m", "nervex.system.launch", str(DQN), "--run-dir", str(run_dir), "--timeout", "120"]
    command += ["--set", "evaluator.stop_val=100000", "--set", "num_threads=1"]
    process = subprocess.Popen(command, cwd=REPO_ROOT, env=ENV, stderr=subprocess.PIPE, text=True)
    try:
        pid = _wait_for_pid(run_dir / "logs" / "league_manager.log", "registered league_manager", 180)
        os.kill(pid, signal.SIGKILL)
        _, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 1
    assert "league_manager exited with status -9" in stderr
    no_role_left(run_dir)


def test_launch_stops_every_role_on_ctrl_c(tmp_path):
    run_dir = tmp_path / "run"
    command = [sys.executable, "-m", "nervex.system.launch", str(DQN), "--run-dir", str(run_dir), "--timeout", "120"]
    command += ["--set", "evaluator.stop_val=100000", "--set", "num_threads=1"]
    # SIGINT's default action, as a terminal's foreground job has it: a shell that starts the tests in the background
    # without job control hands its children SIGINT ignored, and Python then installs no KeyboardInterrupt handler
    process = subprocess.Popen(
        command,
        cwd=REPO_ROOT,
        env=ENV,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        _wait_for_text(run_dir / "logs" / "actor-0.log", "registered actor", 180)
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130, stderr[-2000:]
    no_role_left(run_dir)
    # SIGTERM made the learner write a checkpoint on its way out
    assert "checkpoint (stop" in (run_dir / "logs" / "learner-0.log").read_text()


def _wait_for_text(path: Path, text: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            content = path.read_text()
            if text in content:
                return content
        time.sleep(0.1)
    raise AssertionError(f"{text!r} did not appear in {path} within {timeout} s")


def _wait_for_pid(log: Path, text: str, timeout: float) -> int:
    """The pid in a role's registration line (``... registered <role> <role>-<host>-<pid> with ...``)."""
    content = _wait_for_text(log, text, timeout)
    line = next(line for line in content.splitlines() if text in line)
    worker_id = line.split(text, 1)[1].split()[0]
    return int(worker_id.rsplit("-", 1)[1])


# ---------------------------------------------------------------------------------------------------- faults


class Roles:
    """The roles of one run started one by one (``Launch``), so a test can kill and restart any of them."""

    def __init__(self, run_dir: Path, config: Path, *overrides: str) -> None:
        self.launch = Launch(str(config), str(run_dir), ["num_threads=1", *overrides], actors=None)
        self.run_dir = run_dir

    def __enter__(self) -> Roles:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.launch.stop_all(grace_s=10.0)

    def start(self, role: str, *extra: str) -> subprocess.Popen:
        process = self.launch.start(role, list(extra))
        return process


def _status(run_dir: Path) -> Dict[str, Any]:
    from nervex.system.comm.auth import load_or_create_token
    from nervex.system.comm.client import Client

    url = read_coordinator_url(str(run_dir))
    with Client(url, load_or_create_token(str(run_dir)), deadline_s=10.0) as client:
        return client.post("/v1/status", {})


def _wait(predicate, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"{what} did not happen within {timeout} s")


WRITES_BUT_NEVER_REPORTS = """
import sys, time
from nervex.system import role
call = role.RoleLink.call_registered
def complete_never(self, path, body):
    if path == "/v1/task/complete":
        with open(sys.argv[1], "w") as f:
            f.write(body["result"]["data"])
        time.sleep(3600)  # killed here: the samples are on disk, the coordinator never hears of them
    return call(self, path, body)
role.RoleLink.call_registered = complete_never
from nervex.system.actor_start import main
sys.exit(main(sys.argv[2:]))
"""


def test_killed_and_stopped_actors_lose_and_duplicate_nothing(tmp_path):
    """Three actors fail while holding a lease: one is killed mid-collection, one is killed after writing its samples
    but before reporting them, one is SIGSTOPped past its lease and continued after its task was re-leased. Each
    task is done exactly once, the late result is dropped and its file deleted, the unreported file is swept, and
    the learner's env steps equal the accepted ones."""
    run_dir = tmp_path / "run"
    overrides = (
        "system.coordinator.lease_s=2.0",
        "system.coordinator.heartbeat_s=0.5",
        "system.coordinator.n_sample=1000",  # a task collects for a while: kills land mid-collection
        "system.coordinator.samples_per_insert=null",
        # room for more tasks than the failed actors can hold (each holds up to two leases): the run must not reach
        # max_env_step before the stopped actor's task is leased again
        "max_env_step=16000",
        "evaluator.stop_val=100000",
    )
    with Roles(run_dir, DQN, *overrides) as roles:
        roles.start("coordinator")
        roles.launch.wait_for_coordinator()
        roles.start("league_manager")
        learner = roles.start("learner")
        killed = roles.start("actor", "--index", "0")
        stopped = roles.start("actor", "--index", "1")
        marker = tmp_path / "unreported"
        args = roles.launch.common + ["--index", "2"]
        silent = subprocess.Popen(
            [sys.executable, "-c", WRITES_BUT_NEVER_REPORTS, str(marker), *args], cwd=REPO_ROOT, env=ENV
        )
        roles.launch.started.append(("actor", silent))
        held, frozen = {}, {}
        for name, process in (("killed", killed), ("stopped", stopped)):
            held[name], frozen[name] = _stop_holding_a_lease(run_dir, process, name)
        os.kill(killed.pid, signal.SIGKILL)  # its I/O process dies with it (PR_SET_PDEATHSIG), stopped or not
        _wait(marker.exists, 60, "the silent actor's samples file")
        os.kill(silent.pid, signal.SIGKILL)
        unreported = marker.read_text()
        # the replacement actor starts once the stopped actor's lease has run out: it takes the oldest pending tasks
        # first, that one among them (started earlier, it could fill the run with new tasks before the expiry)
        _wait(
            lambda: _attempts(run_dir, held["stopped"]) > 1 or _state(run_dir, held["stopped"]) == "pending",
            30,
            "the stopped actor's lease running out",
        )
        roles.start("actor", "--index", "3")
        _wait(lambda: _attempts(run_dir, held["stopped"]) > 1, 60, "the stopped actor's task leased again")
        _wait(lambda: _state(run_dir, held["stopped"]) == "done", 60, "the stopped actor's task done by another")
        _signal_all(frozen["stopped"], signal.SIGCONT)
        assert learner.wait(timeout=240) == 0
        stopped.wait(timeout=30)
    results = {r["task_id"]: r for r in accepted_results(run_dir)}
    assert results[held["killed"]]["attempts"] >= 2 and results[held["stopped"]]["attempts"] >= 2
    assert unreported not in {r["result"]["data"] for r in results.values()}
    assert_exact_accounting(run_dir)
    coordinator_log = (run_dir / "logs" / "coordinator.log").read_text()
    assert "re-queued" in coordinator_log
    assert f"dropped a stale result of task {held['stopped']} and deleted" in coordinator_log
    # the unreported file is an orphan: the coordinator's sweep deletes it once it is older than a task can live
    from nervex.config import apply_overrides
    from nervex.entry import compile_parallel_config
    from nervex.system.coordinator import Coordinator

    orphan = run_dir / "storage" / unreported
    if orphan.exists():
        time.sleep(max(0.0, 2.0 * 4 + 0.5 - (time.time() - orphan.stat().st_mtime)))
        cfg = apply_overrides(read_config(str(DQN)), ["num_threads=1", *overrides])
        with Coordinator(compile_parallel_config(cfg), str(run_dir)) as coordinator:
            assert coordinator.sweep()["orphans"] >= 1
    assert not orphan.exists()
    assert "result dropped" in (run_dir / "logs" / "actor-1.log").read_text()
    no_role_left(run_dir)


def _query(run_dir: Path, sql: str, *params: Any) -> List[Any]:
    conn = sqlite3.connect(run_dir / "coordinator.sqlite")
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


def _lease_of(run_dir: Path, pid: int) -> Optional[str]:
    """The newest task leased to the worker with this pid: with prefetch, an older lease may be a finished task whose
    report is on its way."""
    rows = _query(
        run_dir, "SELECT task_id FROM tasks WHERE state='leased' AND worker_id LIKE ? ORDER BY num DESC", f"%-{pid}"
    )
    return rows[0][0] if rows else None


def _family(pid: int) -> List[int]:
    """``pid`` and its descendants (Linux's ``/proc/<pid>/task/<tid>/children``): an actor and its I/O process."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        for children in Path(f"/proc/{current}/task").glob("*/children"):
            with contextlib.suppress(OSError, ValueError):
                todo.extend(int(child) for child in children.read_text().split())
    return found


def _signal_all(pids: List[int], signum: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)


def _stop_holding_a_lease(run_dir: Path, process: subprocess.Popen, name: str) -> Tuple[str, List[int]]:
    """SIGSTOPs an actor and its I/O process at a moment the actor holds a lease that stays open (no process of it can
    complete the task while stopped); returns that task and the stopped pids. A lease seen just before the stop may
    belong to a report already sent: the lease is read again once requests sent before the stop have landed, and the
    actor is continued and stopped again if none is left."""
    for _ in range(20):
        _wait(lambda: _lease_of(run_dir, process.pid), 60, f"a lease held by the {name} actor")
        family = _family(process.pid)
        _signal_all(family, signal.SIGSTOP)
        # shorter than a lease (2 s, renewed every 0.5 s): a task still leased now stays so until its lease runs out
        time.sleep(0.3)
        task = _lease_of(run_dir, process.pid)
        if task is not None:
            return task, family
        _signal_all(family, signal.SIGCONT)
    raise AssertionError(f"the {name} actor never held a lease while stopped")


def _attempts(run_dir: Path, task_id: str) -> int:
    return int(_query(run_dir, "SELECT attempts FROM tasks WHERE task_id=?", task_id)[0][0])


def _state(run_dir: Path, task_id: str) -> str:
    return str(_query(run_dir, "SELECT state FROM tasks WHERE task_id=?", task_id)[0][0])


def test_coordinator_killed_and_restarted_mid_run(tmp_path):
    """kill -9 the coordinator mid-run and start it again: workers reconnect, the task table is intact, 195."""
    run_dir = tmp_path / "run"
    with Roles(run_dir, DQN, "evaluator.eval_freq=4000") as roles:  # not at 195 before the kill
        first = roles.start("coordinator")
        roles.launch.wait_for_coordinator()
        url = read_coordinator_url(str(run_dir))
        roles.start("league_manager")
        learner = roles.start("learner")
        roles.start("manager", "--actors", "1")
        done_before = _wait(lambda: _status(run_dir)["tasks"].get("done", 0) >= 5 and _done(run_dir), 90, "5 tasks")
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)
        time.sleep(1.0)
        roles.start("coordinator")
        _wait(lambda: read_coordinator_url(str(run_dir)) == url and _healthy(url), 30, "the coordinator back")
        assert set(done_before) <= set(_done(run_dir)), "a done task was lost"
        assert learner.wait(timeout=240) == 0
    assert float(eval_rows(run_dir)[-1]["mean_reward"]) >= 195.0
    assert_exact_accounting(run_dir)
    no_role_left(run_dir)


def _done(run_dir: Path) -> List[str]:
    return [r["task_id"] for r in accepted_results(run_dir)]


def _healthy(url: str) -> bool:
    import requests

    try:
        return requests.get(url + "/healthz", timeout=1).status_code == 200
    except requests.RequestException:
        return False


def test_learner_killed_resumes_with_identical_parameters_and_optimizer_state(tmp_path):
    """kill -9 the learner after a periodic checkpoint: a new learner loads the newest checkpoint exactly (weights,
    optimizer moments, counters, poll cursor) and the run goes on to 195."""
    run_dir = tmp_path / "run"
    # about one checkpoint a second; the first evaluation late enough for two of them (195 is often reached at 1024)
    overrides = ("system.learner.checkpoint_interval_min=0.02", "evaluator.eval_freq=4000")
    with Roles(run_dir, DQN, *overrides) as roles:
        roles.start("coordinator")
        roles.launch.wait_for_coordinator()
        roles.start("league_manager")
        first = roles.start("learner")
        roles.start("manager", "--actors", "1")
        _wait(lambda: len(list((run_dir / "ckpt").glob("iteration_*.pt"))) >= 2, 240, "two periodic checkpoints")
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)
        saved = latest_checkpoint(run_dir)
        assert saved["train_iter"] > 0 and saved["system"]["seq"] > 0

        from nervex.system.learner import LearnerRole

        cfg = read_config(str(DQN))
        cfg.num_threads = 1
        cfg.system.learner.checkpoint_interval_min = 0.02
        cfg.evaluator.eval_freq = 4000
        resumed = LearnerRole(cfg, str(run_dir), "learner-probe")
        try:
            state = resumed.learner.state_dict()
            assert (state["train_iter"], state["env_step"]) == (saved["train_iter"], saved["env_step"])
            assert resumed.seq == saved["system"]["seq"]
            _assert_equal_trees(state["policy"], saved["policy"])
        finally:
            resumed.keeper.interval_s = float("inf")
            resumed._closed = True  # a probe: no checkpoint of its own
            for manager in resumed._env_managers:
                manager.close()
        second = roles.start("learner")
        assert second.wait(timeout=240) == 0
    assert float(eval_rows(run_dir)[-1]["mean_reward"]) >= 195.0
    log = (run_dir / "logs" / "learner-0.log").read_text()
    assert f"resumed from {run_dir}/ckpt/iteration_" in log
    no_role_left(run_dir)


def _assert_equal_trees(a: Any, b: Any, path: str = "") -> None:
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b), path
    elif isinstance(a, dict):
        assert set(a) == set(b), path
        for key in a:
            _assert_equal_trees(a[key], b[key], f"{path}/{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_equal_trees(x, y, f"{path}/{i}")
    else:
        assert a == b, path


def test_two_gloo_learner_ranks_train_as_one_learner_to_195(tmp_path):
    """Two learner processes (torchrun's variables) form one data-parallel learner: rank 0 talks to the
    coordinator, rank 1 trains on the same data with its own batches, gradients averaged; the run reaches 195 and
    both ranks end with the same weights."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run_dir = tmp_path / "run"
    with Roles(run_dir, DQN, "system.learner.dist_timeout_s=60") as roles:
        roles.start("coordinator")
        roles.launch.wait_for_coordinator()
        roles.start("league_manager")
        roles.start("manager", "--actors", "1")
        ranks = []
        for rank in (0, 1):
            env = dict(ENV, RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1")
            env["MASTER_PORT"] = str(port)
            command = [sys.executable, "-m", "nervex.system.learner_start", *roles.launch.common]
            process = subprocess.Popen(command, cwd=REPO_ROOT, env=env, start_new_session=True)
            roles.launch.started.append(("learner", process))
            ranks.append(process)
        assert ranks[0].wait(timeout=300) == 0
        assert ranks[1].wait(timeout=60) == 0
    assert float(eval_rows(run_dir)[-1]["mean_reward"]) >= 195.0
    assert_exact_accounting(run_dir)
    rank1_log = (run_dir / "logs" / "learner-1.log").read_text()
    assert "learner stopped" in rank1_log
    no_role_left(run_dir)


@pytest.mark.parametrize("role", ["coordinator", "manager", "league_manager", "learner", "actor"])
def test_every_role_has_help_and_refuses_a_bad_config(tmp_path, role):
    module = f"nervex.system.{role}_start"
    shown = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True, env=ENV)
    assert shown.returncode == 0 and "--config" in shown.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text(DQN.read_text().replace("  learner:\n    snapshot_every", "  learner:\n    snapshot_evry"))
    refused = subprocess.run(
        [sys.executable, "-m", module, "--config", str(bad), "--run-dir", str(tmp_path / "run")],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=120,
    )
    assert refused.returncode == 2
    assert "system.learner.snapshot_evry" in refused.stderr and "snapshot_every" in refused.stderr


@pytest.mark.slow
def test_chaos_soak_an_actor_killed_every_few_seconds_still_reaches_the_target(tmp_path):
    """./run.sh dist's launcher with 2 actors, the newest SIGKILLed every 5 s (the issue asks for every 20 s; the
    run is shorter than that here): the manager restarts each, the leases re-queue, PPO still reaches a perfect 500
    (a harder target than the config's 475, so that the run lasts through several kills)."""
    run_dir = tmp_path / "run"
    command = [sys.executable, "-m", "nervex.system.launch", str(PPO), "--run-dir", str(run_dir), "--actors", "2"]
    command += ["--timeout", "600", "--set", "num_threads=1", "--set", "system.coordinator.lease_s=3.0"]
    command += ["--set", "evaluator.stop_val=500"]
    process = subprocess.Popen(command, cwd=REPO_ROOT, env=ENV, stderr=subprocess.PIPE, text=True)
    kills = 0
    try:
        _wait_for_text(run_dir / "logs" / "manager-0.log", "started actor 1", 120)
        while process.poll() is None:
            time.sleep(5.0)
            log = (run_dir / "logs" / "manager-0.log").read_text()
            pids = [int(line.rsplit("pid ", 1)[1].rstrip(")")) for line in log.splitlines() if "started actor" in line]
            try:
                os.kill(pids[-1], signal.SIGKILL)
                kills += 1
            except ProcessLookupError:
                pass
        _, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, stderr[-3000:]
    assert kills >= 2
    assert float(eval_rows(run_dir)[-1]["mean_reward"]) >= 500.0
    assert "restarting in" in (run_dir / "logs" / "manager-0.log").read_text()
    assert_exact_accounting(run_dir)
