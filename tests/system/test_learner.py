"""The parallel learner and the serial trainer drive one learn loop: on the same data they end with the same state.

The serial trainer runs a few iterations and records each collection; the same collections are then completed as
tasks at a real coordinator (in-process, 127.0.0.1) and a ``LearnerRole`` steps once per task. Weights, optimizer
moments and target networks must be bitwise equal, and so must the counters.
"""

from __future__ import annotations

import copy
import logging
import secrets
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest
import torch

from nervex.entry import DefaultCallbacks, SerialTrainer, compile_parallel_config
from nervex.system.comm.client import Client
from nervex.system.comm.storage import Storage
from nervex.system.coordinator import Coordinator
from nervex.system.protocol import PROTOCOL_VERSION, REGISTER_PATH, TASK_COMPLETE_PATH, TASK_LEASE_PATH
from nervex.system.samples import encode_samples
from nervex.system.system_config import storage_root

TOKEN = secrets.token_bytes(32)
ENV = {"env_type": "cartpole", "manager_type": "base", "collector_env_num": 2, "evaluator_env_num": 1}
NO_EVAL = {"n_episode": 1, "eval_freq": 10**9, "stop_val": 10**9}
QUIET = {"hook": {"log_show_after_iter": 0, "save_ckpt_after_run": False}}

CASES = {
    # off-policy: prioritized replay, training starts with the collection that reaches learning_starts (16)
    "dqn": (
        {
            "policy_type": "dqn",
            "model": {"hidden_sizes": [16]},
            "nstep": 1,
            "learn": {"batch_size": 8, "learning_starts": 16, "update_per_collect": 3, "target_update_freq": 5},
            "collect": {"n_sample": 8},
        },
        8,
    ),
    # on-policy: 2 epochs of shuffled minibatches of 10 over each 32-sample rollout
    "ppo": (
        {
            "policy_type": "ppo",
            "model": {"hidden_sizes": [16]},
            "learn": {"epoch_per_collect": 2, "batch_size": 10},
            "collect": {"rollout_len": 16},
        },
        3,
    ),
}


def run_cfg(policy: Dict[str, Any]) -> Dict[str, Any]:
    cfg = {"seed": 5, "max_env_step": 10**6, "env": dict(ENV), "policy": copy.deepcopy(policy)}
    return dict(cfg, learner=copy.deepcopy(QUIET), evaluator=dict(NO_EVAL))


class Recorder(DefaultCallbacks):
    def __init__(self) -> None:
        self.collections: List[Tuple[List[Dict[str, Any]], int, int]] = []  # (samples, env steps, policy_iter)
        self._env_step = 0

    def on_sample_end(self, trainer: SerialTrainer, samples: List[Dict[str, Any]]) -> None:
        self.collections.append((samples, trainer.env_step - self._env_step, trainer.train_iter))
        self._env_step = trainer.env_step


def serial_run(policy: Dict[str, Any], iterations: int, run_root: Path) -> Tuple[Recorder, Dict[str, Any], Any]:
    recorder = Recorder()
    with SerialTrainer(run_cfg(policy), exp_name="serial", run_root=str(run_root), callbacks=recorder) as trainer:
        initial = copy.deepcopy(trainer.policy.state_dict())
        for _ in range(iterations):
            trainer.train()
        state = trainer.loop.state_dict()
    return recorder, state, initial


def leaves(value: Any, path: str = "") -> Dict[str, Any]:
    if isinstance(value, dict):
        out: Dict[str, Any] = {}
        for key, item in value.items():
            out.update(leaves(item, f"{path}/{key}"))
        return out
    if isinstance(value, (list, tuple)):
        out = {}
        for i, item in enumerate(value):
            out.update(leaves(item, f"{path}[{i}]"))
        return out
    return {path: value}


def assert_same_state(actual: Dict[str, Any], expected: Dict[str, Any]) -> None:
    got, want = leaves(actual), leaves(expected)
    assert got.keys() == want.keys()
    for path, value in want.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(got[path], value), path
        else:
            assert got[path] == value, path


@pytest.mark.parametrize("policy, iterations", CASES.values(), ids=CASES.keys())
def test_the_parallel_learner_ends_bitwise_equal_to_the_serial_trainer_on_the_same_data(tmp_path, policy, iterations):
    from nervex.system.learner import LearnerRole

    recorder, serial_state, serial_initial = serial_run(policy, iterations, tmp_path / "runs")
    raw = compile_parallel_config(
        dict(run_cfg(policy), system={"coordinator": {"tick_s": 3600.0, "min_free_bytes": 0}})
    )
    run_dir = tmp_path / "parallel"
    coordinator = Coordinator(raw, str(run_dir), token=TOKEN, logger=logging.getLogger("test_learner.coordinator"))
    coordinator.start()
    learner = None
    try:
        storage = Storage(storage_root(coordinator.cfg, coordinator.run_dir), min_free_bytes=0)
        learner = LearnerRole(raw, str(run_dir), "learner0", url=coordinator.url, token=TOKEN)
        assert_same_state(learner.policy.state_dict(), serial_initial)  # one seed, one initialisation
        with Client(coordinator.url, TOKEN, deadline_s=10.0) as client:
            register = dict(worker_id="actor0", role="actor", protocol=PROTOCOL_VERSION)
            client.post(REGISTER_PATH, dict(register, config_hash=coordinator.config_hash))
            for samples, env_steps, policy_iter in recorder.collections:
                task = client.post(TASK_LEASE_PATH, {"worker_id": "actor0", "kind": "collect"})["task"]
                assert task is not None
                data = storage.put(encode_samples(samples), "samples")
                result = dict(
                    data=data, n_samples=len(samples), env_steps=env_steps, episodes=[], policy_iter=policy_iter
                )
                body = dict(worker_id="actor0", task_id=task["task_id"], lease_id=task["lease_id"], result=result)
                assert client.post(TASK_COMPLETE_PATH, body) == {"accepted": True}
                seq = learner.seq
                while learner.seq == seq or not learner.intake.needs_data():  # this task read, its steps trained
                    learner.step()
        assert learner.counters == {"results": iterations, "dropped_stale": 0, "missing": 0, "bad_data": 0}
        assert serial_state["train_iter"] > 0
        assert_same_state(learner.checkpoint_state(), dict(serial_state, system=learner.checkpoint_state()["system"]))
    finally:
        if learner is not None:
            learner.close()
        coordinator.stop()
