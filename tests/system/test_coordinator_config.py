"""The coordinator knows no policy: the compiled ``system.collect`` carries the policy contract's collect unit, count and
``learning_starts`` as plain values, and a running coordinator process has imported no torch, gymnasium or policy.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import List

import pytest

from nervex.config import ConfigError, apply_overrides, read_config, save_config, to_plain
from nervex.entry import compile_parallel_config
from nervex.system.comm.auth import load_or_create_token
from nervex.system.comm.client import Client
from nervex.system.comm.storage import Storage
from nervex.system.protocol import (
    DATA_POLL_PATH,
    PROTOCOL_VERSION,
    REGISTER_PATH,
    TASK_COMPLETE_PATH,
    TASK_LEASE_PATH,
    read_coordinator_url,
)
from nervex.system.system_config import compile_coordinator_config, config_hash

REPO_ROOT = Path(__file__).resolve().parents[2]
DIST = REPO_ROOT / "app_zoo" / "classic_control" / "cartpole" / "dist"
DQN_DIST, PPO_DIST = DIST / "cartpole_dqn_dist.yaml", DIST / "cartpole_ppo_dist.yaml"
ENV = dict(os.environ, PYTHONPATH=str(REPO_ROOT), OMP_NUM_THREADS="1")
OVERRIDES = ["system.coordinator.min_free_bytes=0", "system.coordinator.tick_s=0.1"]
RUNTIME = ("torch", "gymnasium", "nervex.policy", "nervex.envs", "nervex.entry", "nervex.worker", "nervex.model")

# The real coordinator_start, in its own process; once it has stopped, what it imported goes to argv[1].
WRAPPER = r"""
import json, sys
from nervex.system.coordinator_start import main
code = main(sys.argv[2:])
with open(sys.argv[1], "w") as f:
    json.dump(sorted(sys.modules), f)
sys.exit(code)
"""


# --------------------------------------------------------------------------- system.collect
def test_system_collect_holds_the_policy_contract_as_plain_values():
    dqn = compile_parallel_config(read_config(DQN_DIST))
    assert dqn.system.collect == {"unit": "sample", "n": 512, "restart_envs": False, "learning_starts": 500}
    no_override = compile_parallel_config(apply_overrides(read_config(DQN_DIST), ["system.coordinator.n_sample=null"]))
    assert no_override.system.collect.n == 8  # policy.collect.n_sample
    ppo = compile_parallel_config(read_config(PPO_DIST))
    assert ppo.system.collect == {"unit": "rollout", "n": ppo.policy.collect.rollout_len, "restart_envs": False,
                                  "learning_starts": 0}  # fmt: skip
    episodes = compile_parallel_config(apply_overrides(read_config(PPO_DIST), ["policy.collect.n_episode=3"]))
    assert dict(episodes.system.collect, learning_starts=0) == {
        "unit": "episode",
        "n": 3,
        "restart_envs": True,
        "learning_starts": 0,
    }


def test_a_hand_set_system_collect_value_must_match_the_policy():
    same = apply_overrides(read_config(DQN_DIST), ["system.collect.unit=sample", "system.collect.learning_starts=500"])
    assert compile_parallel_config(same).system.collect.n == 512
    for override, message in (
        ("system.collect.unit=rollout", "key 'system.collect.unit' in cartpole_dqn_dist.yaml is 'rollout', but"),
        ("system.collect.n=8", "key 'system.collect.n' in cartpole_dqn_dist.yaml is 8, but"),
        ("system.collect.learning_starts=0", "key 'system.collect.learning_starts' in cartpole_dqn_dist.yaml is 0"),
        ("system.collect.unit=batch", "key 'system.collect.unit' in cartpole_dqn_dist.yaml must be one of"),
        ("system.collect.unt=sample", "did you mean 'system.collect.unit'"),
    ):
        with pytest.raises(ConfigError, match=override.split("=")[0].replace(".", r"\.")) as info:
            compile_parallel_config(apply_overrides(read_config(DQN_DIST), [override]))
        assert message in str(info.value)
    with pytest.raises(ConfigError, match="system.coordinator.n_sample.*collects by rollout"):
        compile_parallel_config(apply_overrides(read_config(PPO_DIST), ["system.coordinator.n_sample=64"]))


def test_the_coordinator_reads_the_written_config_and_refuses_a_users_yaml(tmp_path):
    compiled = compile_parallel_config(apply_overrides(read_config(DQN_DIST), OVERRIDES))
    save_config(compiled, tmp_path / "config.yaml")
    back = compile_coordinator_config(read_config(tmp_path / "config.yaml"))
    assert to_plain(back) == to_plain(compiled) and config_hash(back) == config_hash(compiled)
    with pytest.raises(
        ConfigError, match=r"key 'system\.collect' in cartpole_dqn_dist\.yaml is not set: .*compile_parallel_config"
    ):
        compile_coordinator_config(read_config(DQN_DIST))
    edited = to_plain(compiled)
    edited["system"]["coordinator"]["lease_s"] = 0
    with pytest.raises(ConfigError, match=r"key 'system\.coordinator\.lease_s' must be > 0"):
        compile_coordinator_config(edited)
    edited = dict(to_plain(compiled), evaluater={})
    with pytest.raises(ConfigError, match="unknown key 'evaluater'; did you mean 'evaluator'"):
        compile_coordinator_config(edited)


# --------------------------------------------------------------------------- the running process
def _serve_a_task(run_dir: Path, cfg_hash: str, process: subprocess.Popen, timeout_s: float = 120.0) -> dict:
    """Register an actor and a learner, lease a collect task, complete it and poll it; the task's payload."""
    deadline = time.monotonic() + timeout_s
    while not read_coordinator_url(str(run_dir)):
        assert process.poll() is None, f"coordinator_start exited with {process.returncode}"
        assert time.monotonic() < deadline, "no coordinator.url"
        time.sleep(0.1)
    with Client(read_coordinator_url(str(run_dir)), load_or_create_token(str(run_dir)), deadline_s=60.0) as client:
        for worker_id, role in (("actor0", "actor"), ("learner0", "learner")):
            body = dict(worker_id=worker_id, role=role, protocol=PROTOCOL_VERSION, config_hash=cfg_hash, info={})
            client.post(REGISTER_PATH, body)
        task = None
        while task is None:
            assert time.monotonic() < deadline, "no collect task was created"
            task = client.post(TASK_LEASE_PATH, {"worker_id": "actor0", "kind": "collect"}).get("task")
            time.sleep(0.1)
        data = Storage(str(run_dir / "storage"), min_free_bytes=0).put(b"trajectories", "traj")
        result = dict(data=data, n_samples=512, env_steps=512, episodes=[], policy_iter=0)
        body = dict(worker_id="actor0", task_id=task["task_id"], lease_id=task["lease_id"], result=result)
        assert client.post(TASK_COMPLETE_PATH, body) == {"accepted": True}
        polled = client.post(DATA_POLL_PATH, {"worker_id": "learner0", "since_seq": 0, "limit": 10})["items"]
        assert [item["task_id"] for item in polled] == [task["task_id"]]
    return task["payload"]


@pytest.mark.parametrize("given", ["user yaml", "compiled config.yaml"])
def test_a_running_coordinator_imports_no_torch_gymnasium_or_policy(tmp_path, given):
    """coordinator_start, from the user's YAML (compiled in a child process) or from the run's config.yaml (as
    ./run.sh dist starts it), serves a lease, a completion and a poll; then its sys.modules is read."""
    run_dir, modules_file = tmp_path / "run", tmp_path / "modules.json"
    compiled = compile_parallel_config(apply_overrides(read_config(DQN_DIST), OVERRIDES))
    if given == "user yaml":
        args: List[str] = ["--config", str(DQN_DIST)] + [a for o in OVERRIDES for a in ("--set", o)]
    else:
        run_dir.mkdir()
        save_config(compiled, run_dir / "config.yaml")
        args = ["--config", str(run_dir / "config.yaml")]
    command = [sys.executable, "-c", WRAPPER, str(modules_file), *args, "--run-dir", str(run_dir)]
    with open(tmp_path / "coordinator.out", "wb") as out:
        process = subprocess.Popen(command, cwd=REPO_ROOT, env=ENV, stdout=out, stderr=out)
    try:
        payload = _serve_a_task(run_dir, config_hash(compiled), process)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0, (tmp_path / "coordinator.out").read_text()[-2000:]
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)
    assert (payload["unit"], payload["n"], payload["restart_envs"]) == ("sample", 512, False)
    modules = json.loads(modules_file.read_text())
    assert "nervex.system.coordinator" in modules and "flask" in modules  # it did run the server
    imported = [m for m in modules if any(m == r or m.startswith(r + ".") for r in RUNTIME)]
    assert imported == [], f"the coordinator process imported {imported}"
